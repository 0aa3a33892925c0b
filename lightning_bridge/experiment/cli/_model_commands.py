"""`lightning-bridge model ...` and `experiment sync`: the MLflow side of the record.

`det model create | register-version | list | list-versions | describe` on MLflow's model
registry (`tracking._models`), `checkpoint download models:/NAME/VERSION` (or `@ALIAS`), and
`experiment sync ID`, which sends what the MLflow mirror lacks. Each takes `--tracking-uri`
(default: `MLFLOW_TRACKING_URI`, the workspace's setting, else MLflow's store in the
workspace) and `--json`; without MLflow installed each says which extra to install.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.cli._summary import format_time, table
from lightning_bridge.record._registry import Registry
from lightning_bridge.tracking._settings import (
    EXTRA_HINT,
    mlflow_installed,
    require_mlflow,
    tracking_uri,
    ui_line,
)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _uri(registry: Registry, args: argparse.Namespace, what: str) -> str:
    require_mlflow(what)
    uri = tracking_uri(registry.workspace.root, getattr(args, "tracking_uri", None))
    if uri is None:
        raise InvalidArgumentError(
            f"{what} needs an MLflow tracking server: give --tracking-uri URI or set "
            "MLFLOW_TRACKING_URI (or leave both out for MLflow's store in the workspace)."
        )
    return uri


def _models(args: argparse.Namespace, registry: Registry, what: str) -> Any:
    from lightning_bridge.tracking._models import ModelRegistry

    return ModelRegistry(registry, _uri(registry, args, what))


def experiment_sync(args: argparse.Namespace) -> int:
    if not mlflow_installed():
        raise InvalidArgumentError(f"experiment sync sends the record to MLflow: {EXTRA_HINT}")
    from lightning_bridge.tracking._sync import experiment_uri, sync

    with Registry(args.workspace) as registry:
        registry.reconcile()
        uri = experiment_uri(registry, args.id, args.tracking_uri)
        if uri is None:
            raise InvalidArgumentError(
                "no MLflow tracking URI: give --tracking-uri URI or set MLFLOW_TRACKING_URI."
            )
        mlflow_id = sync(registry, args.id, uri)
        trials = len(registry.trials(args.id))
        line = ui_line(uri, registry.workspace.root)
    if args.json:
        _print_json(
            {"experiment_id": args.id, "mlflow_experiment_id": mlflow_id, "tracking_uri": uri,
             "trials": trials}
        )  # fmt: skip
    else:
        print(f"Experiment {args.id} ({trials} trials) is in MLflow experiment {mlflow_id}")
        print(line)
    return 0


def model_create(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        model = _models(args, registry, "model create").create(args.name, args.description)
    if args.json:
        _print_json(model)
    else:
        print(f"Created model {model['name']}")
    return 0


def model_register_version(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        version = _models(args, registry, "model register-version").register(
            args.name, args.checkpoint, list(args.alias), args.description
        )
    if args.json:
        _print_json(version)
    else:
        aliases = f" (alias {', '.join(version['aliases'])})" if version["aliases"] else ""
        print(
            f"Registered {args.checkpoint} as version {version['version']} of model "
            f"{version['name']}{aliases}; source {version['source']}"
        )
    return 0


def model_alias(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        models = _models(args, registry, "model alias")
        models.set_alias(args.name, args.alias, args.version)
        described = models.describe(args.name)
    if args.json:
        _print_json(described)
    else:
        print(f"Alias {args.alias} of model {args.name} is version {args.version}")
    return 0


def model_list(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        models = _models(args, registry, "model list").models()
    if args.json:
        _print_json(models)
        return 0
    rows = [
        (
            m["name"],
            m["latest_version"] or "-",
            ", ".join(f"{a}={v}" for a, v in sorted(m["aliases"].items())) or "-",
            format_time(m["last_updated_timestamp"] / 1000),
            m["description"],
        )
        for m in models
    ]
    print(table(("Name", "Latest", "Aliases", "Updated", "Description"), rows))
    return 0


def _versions_table(versions: list[dict[str, Any]]) -> str:
    rows = [
        (
            v["version"],
            ", ".join(v["aliases"]) or "-",
            v["tags"].get("lightning_bridge.checkpoint_uuid", "-"),
            v["tags"].get("lightning_bridge.trial_id", "-"),
            v["source"],
        )
        for v in versions
    ]
    return table(("Version", "Aliases", "Checkpoint", "Trial", "Source"), rows)


def model_list_versions(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        versions = _models(args, registry, "model list-versions").versions(args.name)
    if args.json:
        _print_json(versions)
    else:
        print(_versions_table(versions))
    return 0


def model_describe(args: argparse.Namespace) -> int:
    with Registry(args.workspace) as registry:
        model = _models(args, registry, "model describe").describe(args.name)
    if args.json:
        _print_json(model)
        return 0
    print(f"Model {model['name']}: {model['description'] or '(no description)'}")
    print(f"Aliases: {', '.join(f'{a}={v}' for a, v in sorted(model['aliases'].items())) or '-'}")
    print(_versions_table(model["versions"]))
    return 0


def model_download(args: argparse.Namespace) -> int:
    """`checkpoint download models:/NAME/VERSION --out DIR` (or `models:/NAME@ALIAS`)."""
    out = pathlib.Path(args.out).expanduser().resolve()
    with Registry(args.workspace) as registry:
        version, folder = _models(args, registry, "checkpoint download models:/").download(
            args.uuid, out
        )
    if args.json:
        _print_json({**version, "downloaded_to": str(folder)})
    else:
        print(
            f"Downloaded version {version['version']} of model {version['name']} "
            f"(source {version['source']}) to {folder}"
        )
    return 0
