"""`load_trial_from_checkpoint_path`: rebuild a trial from a checkpoint, outside training.

The trial class, hyperparameters and experiment config come from `load_data.json` (Determined
>= 0.17.7 and the bridge) or, in older checkpoints, from `metadata.json` (the config's
`entrypoint` names the class); the class is imported from the checkpoint's `code/` folder.
The trial is built with a standalone context and its models' weights are loaded, so a trained
model can be used for inference or inspection. Checkpoints of the pre-0.14 PyTorchTrial API
(a trial with `build_model()`) give the bare `nn.Module`, as Determined does.
"""

from __future__ import annotations

import pathlib
import warnings
from typing import Any

import torch

from lightning_bridge._errors import InvalidCheckpointError
from lightning_bridge.checkpoint._bounded import read_load_data
from lightning_bridge.checkpoint._models import entries, load_models
from lightning_bridge.checkpoint._safe_load import load_state_file, read_metadata
from lightning_bridge.contract import _import_map
from lightning_bridge.contract._code_import import import_trial_class
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._trial import is_deepspeed_trial_class, is_trial_class

TRUST_HINT = "load_trial_from_checkpoint_path(path, trust_checkpoint=True)"


def _describe(ckpt: pathlib.Path) -> tuple[dict[str, Any], bool]:
    """What the checkpoint says about its trial, and whether it may predate the 0.14 API.

    Returns `trial_cls_spec`, `hparams`, `experiment_config` and `is_trainer` (Determined's
    load_data.json keys).
    """
    load_data_file = ckpt / "load_data.json"
    if load_data_file.is_file():
        return read_load_data(load_data_file), False
    metadata = read_metadata(ckpt)
    config = metadata.get("experiment_config")
    if isinstance(config, dict) and isinstance(config.get("entrypoint"), str):
        # Before load_data.json (<= 0.17.6) every entrypoint named the trial class.
        return {
            "trial_cls_spec": config["entrypoint"],
            "hparams": metadata.get("hparams"),
            "experiment_config": config,
            "is_trainer": False,
        }, True
    return {}, False


class CheckpointLoadContext(PyTorchTrialContext):
    """A context for building a trial outside a fit, e.g. to load a checkpoint into it by hand:
    one process, trial seed 0, the hyperparameters and config given (Determined's
    `pytorch.CheckpointLoadContext`)."""

    def __init__(
        self, hparams: dict[str, Any] | None = None, exp_conf: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            hparams=hparams,
            exp_conf=exp_conf,
            distributed=DistributedContext(rank=0, size=1, local_rank=0, local_size=1),
            trial_seed=0,
        )


def _context(description: dict[str, Any]) -> PyTorchTrialContext:
    config = description.get("experiment_config")
    aggregation = 1
    if isinstance(config, dict) and not description.get("is_trainer", False):
        aggregation = int(ConfigValues.of(config).aggregation_frequency)
    return PyTorchTrialContext(
        hparams=description.get("hparams"),
        exp_conf=config,
        distributed=DistributedContext(rank=0, size=1, local_rank=0, local_size=1),
        aggregation_frequency=aggregation,
    )


def _bare_model(trial: Any, payload: dict[str, Any]) -> torch.nn.Module | None:
    """The pre-0.14 API: the trial built its model in `build_model()`; return it, loaded."""
    build_model = getattr(trial, "build_model", None)
    if not callable(build_model):
        return None
    states = entries(payload, "model_state_dict", "models_state_dict")
    if not states:
        raise InvalidCheckpointError("The checkpoint holds no model state to load.")
    model = build_model()
    load_models([model], {"models_state_dict": states[:1]})
    return model


def _refuse_deepspeed_checkpoint(ckpt: pathlib.Path, trial_class: type | None) -> None:
    """A DeepSpeedTrial's checkpoint holds DeepSpeed engines, which only the trial builds
    (`deepspeed.initialize`, in a process group): say how to load it instead."""
    load_data = ckpt / "load_data.json"
    is_deepspeed = load_data.is_file() and (
        read_load_data(load_data).get("trial_type") == "DeepSpeedTrial"
    )
    if not is_deepspeed and trial_class is not None:
        is_deepspeed = is_deepspeed_trial_class(trial_class)
    if is_deepspeed:
        raise InvalidCheckpointError(
            f"{ckpt} is a DeepSpeedTrial checkpoint: its models are DeepSpeed engines the "
            "trial builds with deepspeed.initialize, which load_trial_from_checkpoint_path does "
            "not run. Build the trial inside det_ds.init() and call trial.load(context, path) "
            "(each engine's load_checkpoint), or read an engine's module weights with "
            "DeepSpeed's deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint"
            "(path, tag='model0') (ZeRO 1-3; docs/deepspeed.md)."
        )


def _kind(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    return f"a {type(obj).__name__}"


def load_trial_from_checkpoint_path(
    path: str | pathlib.Path,
    trial_class: type | None = None,
    trial_kwargs: dict[str, Any] | None = None,
    torch_load_kwargs: dict[str, Any] | None = None,
    trust_checkpoint: bool = False,
    **kwargs: Any,
) -> Any:
    """The trial saved in checkpoint `path`, built with its hparams and its models' weights.

    `trial_class` defaults to the class the checkpoint names (imported from its `code/`
    folder); `trial_kwargs` are passed to its constructor after the context; `torch_load_kwargs`
    go to `torch.load` (the default is a weights-only load). `trust_checkpoint=True` (or
    `torch_load_kwargs={"weights_only": False}`) unpickles arbitrary objects: only for files
    you trust, since unpickling can run code.
    """
    if kwargs:
        if torch_load_kwargs:
            raise ValueError("kwargs may not be set if torch_load_kwargs is also set")
        warnings.warn(
            "Passing **kwargs to load_trial_from_checkpoint_path() is deprecated; pass "
            "torch_load_kwargs={...} instead.",
            FutureWarning,
            stacklevel=2,
        )
        torch_load_kwargs = kwargs
    ckpt = pathlib.Path(path)
    _refuse_deepspeed_checkpoint(ckpt, trial_class)
    payload = load_state_file(
        ckpt, trusted=trust_checkpoint, torch_load_kwargs=torch_load_kwargs, trust_hint=TRUST_HINT
    )
    description, maybe_pre_014 = _describe(ckpt)
    if trial_class is None:
        spec = description.get("trial_cls_spec")
        if not isinstance(spec, str):
            raise InvalidCheckpointError(
                f"{ckpt} has neither a load_data.json nor a metadata.json naming its trial "
                "class (Determined <= 0.17.7 wrote them only on Checkpoint.download(); "
                "Checkpoint.write_metadata_file('metadata.json') adds one). Pass the class: "
                "load_trial_from_checkpoint_path(path, trial_class=MyTrial)."
            )
        trial_class = import_trial_class(spec, ckpt / "code", map_determined=_import_map.install)
        if not is_trial_class(trial_class):
            # load_data.json is data: what it names is only called once it is a trial class.
            raise InvalidCheckpointError(
                f"The checkpoint names {spec!r} as its trial class, but that is "
                f"{_kind(trial_class)}, not a PyTorchTrial subclass, so it was not called; "
                "pass trial_class=MyTrial."
            )
    context = _context(description)
    trial = trial_class(context, **(trial_kwargs or {}))
    if maybe_pre_014:
        model = _bare_model(trial, payload)
        if model is not None:
            return model
    load_models(context.models, payload)
    return trial
