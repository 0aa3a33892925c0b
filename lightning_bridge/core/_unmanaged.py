"""An unmanaged experiment: a script run anywhere (not by `lightning-bridge run`) that asks to
be recorded, as Determined's `core_v2.init(config=...)` made one on its master.

The chief records a new experiment with one trial in the workspace (`LIGHTNING_BRIDGE_WORKSPACE`,
else the user's default) and every process gets the same `RunDescription` of it, which the
Core API's contexts report to as they do under the command (`CoreRun`): metrics, checkpoints,
how it ended; `experiment list/describe`, `checkpoint list` and the MLflow mirror see it.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Mapping
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation.services._run_description import (
    RecordConnection,
    RunDescription,
)


def storage_section(checkpoint_storage: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A `checkpoint_storage` argument (a path, an `s3://` / `gs://` URI or a config section)
    as a config section; None: the trial's own folder in the workspace."""
    if checkpoint_storage is None:
        return None
    if isinstance(checkpoint_storage, Mapping):
        return dict(checkpoint_storage)
    for scheme, kind in (("s3://", "s3"), ("gs://", "gcs")):
        if checkpoint_storage.startswith(scheme):
            bucket, _, prefix = checkpoint_storage[len(scheme) :].partition("/")
            return {"type": kind, "bucket": bucket, "prefix": prefix or None}
    if "://" in checkpoint_storage:
        raise InvalidArgumentError(
            f"checkpoint_storage={checkpoint_storage!r}: expected a path, an s3:// or gs:// "
            "URI, or a checkpoint_storage config dict."
        )
    path = pathlib.Path(checkpoint_storage).expanduser().resolve()
    return {"type": "shared_fs", "host_path": str(path)}


def record_unmanaged(
    *,
    name: str | None,
    description: str | None,
    hparams: Mapping[str, Any] | None,
    data: Mapping[str, Any] | None,
    searcher: Mapping[str, Any] | None,
    checkpoint_storage: str | Mapping[str, Any] | None,
    distributed: DistributedContext,
) -> RunDescription:
    """Record a new unmanaged experiment and its trial (the chief); the run every process
    reports to."""
    searcher = dict(searcher or {"name": "single", "metric": "unmanaged"})
    config: dict[str, Any] = {
        "name": name or f"unmanaged-{uuid.uuid4().hex[:8]}",
        "description": description or "",
        "data": dict(data or {}),
        "hyperparameters": dict(hparams or {}),
        "searcher": searcher,
    }
    section = storage_section(checkpoint_storage)
    if section is not None:
        config["checkpoint_storage"] = section
    from lightning_bridge.record._registry import Registry

    ids = None
    if distributed.rank == 0:
        with Registry(Workspace()) as registry:
            experiment_id = registry.create_experiment(
                config,
                name=config["name"],
                description=config["description"],
                options={"unmanaged": True},
                searcher_metric=searcher.get("metric"),
                smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            )
            trial_id = registry.create_trial(
                experiment_id, hparams=config["hyperparameters"], seed=None
            )
            ids = (str(registry.workspace.root), experiment_id, trial_id)
    root, experiment_id, trial_id = distributed.broadcast(ids)
    trial_dir = Workspace(root).trial_dir(experiment_id, trial_id)
    trial_dir.mkdir(parents=True, exist_ok=True)
    return RunDescription(
        record=RecordConnection(root, experiment_id, trial_id),
        run_dir=trial_dir,
        checkpoint_dir=trial_dir / "checkpoints",
        log_file=trial_dir / "trial.log",
        config=config,
        raw_config=config,
        hparams=config["hyperparameters"],
        options={"unmanaged": True},
    )
