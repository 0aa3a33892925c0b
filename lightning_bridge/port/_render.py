"""Port: the text of the files the tool writes, `model_def.py`, `const.yaml`, `startup-hook.sh`.

Pure rendering from what `_inspect` and `_probe` found (the classes, their hyperparameters,
the searcher metric) and what `_sources` found (the packages to install): nothing here
imports or runs user code.
"""

from __future__ import annotations

import yaml

from lightning_bridge.port._folder import (
    DEFAULT_EPOCHS,
    EXPERIMENT_SEED,
    Hyperparameters,
    Loaded,
    Searcher,
)

_FOUND_BY = {
    "validation": "the first metric validation_step logs",
    "training": "the first value logged in training (the module has no validation; the "
    "trial reports its training epochs as validation metrics)",
    "checkpoint": "ModelCheckpoint's monitor and mode (configure_callbacks()); "
    "checkpoint_policy: best keeps the best checkpoint, as the callback does",
    "source": "read from the source (the classes take arguments without defaults, so port "
    "could not run them): check it",
}


def _command(target: str, datamodule: str | None) -> str:
    return f"lightning-bridge port {target}" + (f" --datamodule {datamodule}" if datamodule else "")


def _trial_name(module: Loaded) -> str:
    return module.qualname.split(".")[-1] + "Trial"


def _model_def(module: Loaded, data: Loaded | None) -> str:
    imports: dict[str, set[str]] = {}
    for loaded in (module, data):
        if loaded is not None:
            imports.setdefault(loaded.module_name, set()).add(loaded.qualname.split(".")[0])
    import_lines = [
        f"from {name} import {', '.join(sorted(imports[name]))}" for name in sorted(imports)
    ]
    arguments = [f"    {module.qualname},"]
    if data is not None:
        arguments.append(f"    datamodule={data.qualname},")
    arguments.append("    base=PyTorchTrial,")
    trained_on = f" on {data.qualname.split('.')[-1]}" if data is not None else ""
    module_name = module.qualname.split(".")[-1]
    return "\n".join(
        [
            f'"""{module_name}{trained_on} as a Determined trial, written by `lightning-bridge '
            "port`.",
            "",
            "Regenerate this folder, from the folder the classes are imported from, with",
            "`lightning-bridge port TARGET"
            + (" --datamodule DATAMODULE" if data is not None else "")
            + " --out <this folder> --force`,",
            f"TARGET being {module.spec}"
            + (f",\nDATAMODULE being {data.spec}." if data is not None else "."),
            '"""',
            "",
            "from lightning_bridge import lightning_trial",
            "",
            "try:",
            "    # Determined's base class where Determined is installed (on a cluster, or when",
            "    # `lightning-bridge run` maps `determined` onto the bridge).",
            "    from determined.pytorch import PyTorchTrial",
            "except ImportError:",
            "    from lightning_bridge import PyTorchTrial",
            "",
            *import_lines,
            "",
            "_PortedTrial = lightning_trial(",
            *arguments,
            ")",
            "",
            "",
            f"class {_trial_name(module)}(_PortedTrial):",
            f'    """{module_name}{trained_on}, built from the hyperparameters in const.yaml."""',
            "",
        ]
    )


def _const_yaml(
    module: Loaded,
    data: Loaded | None,
    hparams: Hyperparameters,
    searcher: Searcher,
    command: str,
) -> str:
    classes = module.qualname.split(".")[-1]
    if data is not None:
        classes += " and " + data.qualname.split(".")[-1]
    header = [
        f"# Written by `{command}`.",
        f"# hyperparameters: the constructor arguments of {classes} with their",
        "# default values; the trial passes each one to the argument of the same name, and",
        "# global_batch_size, split across processes, to `batch_size`.",
        f"# searcher.metric: {_FOUND_BY[searcher.found_by]}; check smaller_is_better and",
        "# max_length.",
    ]
    if hparams.to_fill:
        header.append(
            "# To fill in (arguments without a default value, written as null): "
            + ", ".join(hparams.to_fill)
            + "."
        )
    if hparams.skipped:
        header.append(
            "# Not written (not plain data; the constructor's default applies): "
            + ", ".join(hparams.skipped)
            + "."
        )
    config: dict = {
        "name": module.qualname.split(".")[-1],
        "hyperparameters": {"global_batch_size": hparams.batch_size, **hparams.values},
        "searcher": {
            "name": "single",
            "metric": searcher.metric,
            "smaller_is_better": searcher.smaller_is_better,
            "max_length": {"epochs": DEFAULT_EPOCHS},
        },
        "min_validation_period": {"epochs": 1},
    }
    if searcher.checkpoint_policy is not None:
        config["checkpoint_policy"] = searcher.checkpoint_policy
    config.update(
        {
            "reproducibility": {"experiment_seed": EXPERIMENT_SEED},
            "resources": {"slots_per_trial": 1},
            "entrypoint": f"model_def:{_trial_name(module)}",
        }
    )
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    lines = body.splitlines()
    fill = {name.split(".", 1)[1]: f"{name} has no default" for name in hparams.to_fill}
    if hparams.batch_size is None:
        fill["global_batch_size"] = "port could not run the loaders to tell the batch size"
    for i, line in enumerate(lines):
        key = line.strip().split(":", 1)[0]
        if line.startswith("  ") and not line.startswith("   ") and key in fill:
            if line.rstrip().endswith(": null"):
                lines[i] = f"{line}  # fill in: {fill[key]}"
    return "\n".join(header + lines) + "\n"


def _startup_hook(requirements: list[str]) -> str:
    """The hook: installs the bridge only where the trial's interpreter (the first `python3`
    on PATH: the task container's on Determined, the bridge's own under `lightning-bridge
    run`, which puts its interpreter's folder first) cannot import it, then the packages the
    copied sources import, with that interpreter's pip."""
    from lightning_bridge._version import __version__

    lines = [
        "#!/bin/sh",
        "# Determined runs this in the task container before the entrypoint. It installs",
        "# the bridge, which trains the LightningModule as a trial, where the trial's",
        "# interpreter (the first python3 on PATH; under `lightning-bridge run`, the",
        "# bridge's own) cannot import it yet, and the packages the copied sources import.",
        "set -e",
        'python3 -c "import lightning_bridge" 2>/dev/null ||',
        f'    python3 -m pip install "lightning-bridge=={__version__}"',
    ]
    if requirements:
        lines.append(f"python3 -m pip install {' '.join(requirements)}")
    return "\n".join([*lines, ""])
