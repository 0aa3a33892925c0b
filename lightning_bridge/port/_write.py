"""`lightning-bridge port`: pack a LightningModule (and its DataModule) into a trial folder.

`write_trial_folder("pkg.models:LitModel", out, datamodule="pkg.data:DataModule")` writes a
folder that Determined (`det experiment create const.yaml DIR`) and the bridge's runner
(`lightning-bridge run DIR/const.yaml`) both train unchanged:

- `model_def.py`: the trial, `lightning_trial(LitModel, datamodule=DataModule)` on
  Determined's `PyTorchTrial` where Determined is importable (the bridge's otherwise). It
  imports the user's classes by their import path and holds none of their code.
- `const.yaml`: the constructor arguments of both classes with their default values as
  hyperparameters (`batch_size` as `global_batch_size`; arguments without a default as null,
  to fill in), a `single` searcher on the metric `_probe` found (ModelCheckpoint's monitor,
  the first metric `validation_step` logs, or for a module without validation the first value
  logged in training), a length.
- `startup-hook.sh`: installs the bridge (and the third-party packages the copied sources
  import) in Determined's task container.
- the user's source: the module files / top-level packages of the two classes and the local
  modules they import, copied unchanged, so the folder is a complete context directory. Code
  installed as a distribution is not copied; the startup hook installs it instead.

The metric is found by running the classes (`_probe`), which also runs the checks
`lightning_trial` runs when the trial is built, so a module the trial would refuse is refused
here, before anything is written.

The work is split by concept: `_inspect` (loading the classes, hyperparameters), `_probe`
(checks and the metric, by running them), `_sources` (sources to copy, packages to install)
and `_render` (the files' text); this module checks `--out` and writes the folder.
"""

from __future__ import annotations

import pathlib

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.port._folder import CONST_YAML, MODEL_DEF, STARTUP_HOOK
from lightning_bridge.port._inspect import _check_hooks, _cwd_on_path, _hyperparameters, _load
from lightning_bridge.port._probe import probe
from lightning_bridge.port._render import (
    _command,
    _const_yaml,
    _model_def,
    _startup_hook,
)
from lightning_bridge.port._sources import _copy_source, _sources


def write_trial_folder(
    target: str,
    out: pathlib.Path,
    datamodule: str | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Write the trial folder for `target` (`module:LightningModuleClass`) into `out`.

    `datamodule` (`module:LightningDataModuleClass`) supplies the data when the module has no
    loaders of its own. A non-empty `out` is refused unless `force`, which overwrites the files
    the tool writes and leaves other files alone. Returns `out`.
    """
    out = pathlib.Path(out)
    _check_out(out, force)
    with _cwd_on_path():
        module = _load(target, "LightningModule", "TARGET")
        data = (
            _load(datamodule, "LightningDataModule", "--datamodule")
            if datamodule is not None
            else None
        )
    hparams = _hyperparameters(module.cls, data.cls if data is not None else None)
    _check_hooks(module, data)
    searcher, loader_batch_size = probe(module, data, buildable=not hparams.to_fill)
    if hparams.batch_size is None:
        if loader_batch_size is None and not hparams.to_fill:
            raise InvalidTrialError(
                "Could not tell the batch size: neither class has a `batch_size` constructor "
                "argument and the loader port ran has no `batch_size`. Add a `batch_size` "
                "argument (with a default) to the class that builds the loaders."
            )
        hparams.batch_size = loader_batch_size

    sources, requirements = _sources([module] + ([data] if data is not None else []))
    command = _command(target, datamodule)
    files = {
        MODEL_DEF: _model_def(module, data),
        CONST_YAML: _const_yaml(module, data, hparams, searcher, command),
        STARTUP_HOOK: _startup_hook(requirements),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / STARTUP_HOOK).chmod(0o755)
    for top_level, path in sources:
        _copy_source(path, out, top_level)
    return out


# -- checks -------------------------------------------------------------------------------


def _check_out(out: pathlib.Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {out} is a file; name a directory to write into.")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InvalidArgumentError(
            f"--out {out} is not empty; name a new or empty directory, or pass --force to "
            f"overwrite the files port writes there ({MODEL_DEF}, {CONST_YAML}, "
            f"{STARTUP_HOOK} and the copied sources)."
        )
