"""`load_trial_from_checkpoint_path`: rebuild a trial from a checkpoint, outside training.

Reads `load_data.json` for the trial class, hyperparameters and experiment config, builds the
trial with a standalone context and loads its models' weights, so a trained model can be used
for inference or inspection.
"""

from __future__ import annotations

import importlib
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidCheckpointError
from lightning_bridge.checkpoint._bounded import read_load_data
from lightning_bridge.checkpoint._models import load_models
from lightning_bridge.checkpoint._safe_load import load_state_file
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._trial import is_trial_class


def _import_trial_class(spec: str) -> type:
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname or "<locals>" in qualname:
        raise InvalidCheckpointError(
            f"The checkpoint's trial class {spec!r} cannot be imported by name; pass it with "
            "load_trial_from_checkpoint_path(path, trial_class=MyTrial)."
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidCheckpointError(
            f"Could not import the checkpoint's trial class {spec!r} ({exc}); make its module "
            "importable (e.g. add its folder to PYTHONPATH) or pass trial_class=MyTrial."
        ) from None
    if not is_trial_class(obj):
        # load_data.json is data: what it names is only called once it is a trial class.
        raise InvalidCheckpointError(
            f"The checkpoint's load_data.json names {spec!r} as its trial class, but that is "
            f"{_kind(obj)}, not a PyTorchTrial subclass, so it was not called; pass "
            "trial_class=MyTrial."
        )
    return obj


def _kind(obj: Any) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    return f"a {type(obj).__name__}"


def load_trial_from_checkpoint_path(
    path: str | pathlib.Path,
    trial_class: type | None = None,
    trial_kwargs: dict[str, Any] | None = None,
    torch_load_kwargs: dict[str, Any] | None = None,
) -> Any:
    """The trial saved in checkpoint `path`, built with its hparams and its models' weights.

    `trial_class` defaults to the class named in `load_data.json`; `trial_kwargs` are passed to
    its constructor after the context; `torch_load_kwargs` go to `torch.load` (the default is a
    weights-only load; `{"weights_only": False}` loads trusted files with arbitrary objects).
    """
    ckpt = pathlib.Path(path)
    payload = load_state_file(ckpt, torch_load_kwargs=torch_load_kwargs)
    load_data_file = ckpt / "load_data.json"
    load_data: dict[str, Any] = {}
    if load_data_file.is_file():
        load_data = read_load_data(load_data_file)
    if trial_class is None:
        if "trial_cls_spec" not in load_data:
            raise InvalidCheckpointError(
                f"{ckpt} has no load_data.json naming its trial class; pass trial_class=MyTrial."
            )
        trial_class = _import_trial_class(load_data["trial_cls_spec"])
    context = PyTorchTrialContext(
        hparams=load_data.get("hparams"),
        exp_conf=load_data.get("experiment_config"),
        distributed=DistributedContext(rank=0, size=1, local_rank=0, local_size=1),
    )
    trial = trial_class(context, **(trial_kwargs or {}))
    load_models(context.models, payload)
    return trial
