"""Run Determined `PyTorchTrial` / Trainer-API code on PyTorch Lightning.

`import lightning_bridge as pytorch` stands in for `from determined import pytorch`: the same
names, the same semantics, with Lightning's engine (strategies, precision, loggers, progress
bars, profilers) underneath. `TrialModule` is the generated LightningModule, usable with any
`lightning.Trainer`.

The public names are loaded on first use: `import lightning_bridge` costs nothing, so the
`lightning-bridge` command answers `--help`, `--version` and config errors at once and imports
torch and Lightning only when a trial trains.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import (
    BridgeError,
    CheckpointWriteError,
    InvalidArgumentError,
    InvalidCheckpointError,
    InvalidHP,
    InvalidTrialError,
)
from lightning_bridge._version import __version__

if TYPE_CHECKING:
    from lightning_bridge import samplers
    from lightning_bridge.adapter._lightning_trial import LightningAdapter, lightning_trial
    from lightning_bridge.contract._callback import PyTorchCallback
    from lightning_bridge.contract._context import PyTorchTrialContext
    from lightning_bridge.contract._data import (
        DataLoader,
        TorchData,
        adapt_batch_sampler,
        data_length,
        to_device,
    )
    from lightning_bridge.contract._distributed import DistributedContext
    from lightning_bridge.contract._experimental import PyTorchExperimentalContext
    from lightning_bridge.contract._load import (
        CheckpointLoadContext,
        load_trial_from_checkpoint_path,
    )
    from lightning_bridge.contract._lr_scheduler import LRScheduler
    from lightning_bridge.contract._reducer import MetricReducer, Reducer
    from lightning_bridge.contract._trial import PyTorchTrial
    from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
    from lightning_bridge.translation.fit._determined_checkpoint import DeterminedCheckpoint
    from lightning_bridge.translation.fit._init import init
    from lightning_bridge.translation.fit._trainer_api import Trainer
    from lightning_bridge.translation.fit._trial_module import TrialModule

# Public name -> the module that defines it. The Lightning adapter reuses Lightning's private
# helpers, so a Lightning release which moved one breaks only the adapter, with its message.
_LAZY = {
    "Batch": "lightning_bridge.contract._units",
    "CheckpointLoadContext": "lightning_bridge.contract._load",
    "DataLoader": "lightning_bridge.contract._data",
    "DeterminedCheckpoint": "lightning_bridge.translation.fit._determined_checkpoint",
    "DistributedContext": "lightning_bridge.contract._distributed",
    "Epoch": "lightning_bridge.contract._units",
    "LightningAdapter": "lightning_bridge.adapter._lightning_trial",
    "LRScheduler": "lightning_bridge.contract._lr_scheduler",
    "MetricReducer": "lightning_bridge.contract._reducer",
    "PyTorchCallback": "lightning_bridge.contract._callback",
    "PyTorchExperimentalContext": "lightning_bridge.contract._experimental",
    "PyTorchTrial": "lightning_bridge.contract._trial",
    "PyTorchTrialContext": "lightning_bridge.contract._context",
    "Reducer": "lightning_bridge.contract._reducer",
    "TorchData": "lightning_bridge.contract._data",
    "TrainUnit": "lightning_bridge.contract._units",
    "Trainer": "lightning_bridge.translation.fit._trainer_api",
    "TrialModule": "lightning_bridge.translation.fit._trial_module",
    "adapt_batch_sampler": "lightning_bridge.contract._data",
    "data_length": "lightning_bridge.contract._data",
    "init": "lightning_bridge.translation.fit._init",
    "lightning_trial": "lightning_bridge.adapter._lightning_trial",
    "load_trial_from_checkpoint_path": "lightning_bridge.contract._load",
    "to_device": "lightning_bridge.contract._data",
}


def __getattr__(name: str) -> Any:
    if name == "samplers":
        return importlib.import_module("lightning_bridge.samplers")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Batch",
    "BridgeError",
    "CheckpointLoadContext",
    "CheckpointWriteError",
    "DataLoader",
    "DeterminedCheckpoint",
    "DistributedContext",
    "Epoch",
    "InvalidArgumentError",
    "InvalidCheckpointError",
    "InvalidHP",
    "InvalidTrialError",
    "LightningAdapter",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchExperimentalContext",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "TorchData",
    "TrainUnit",
    "Trainer",
    "TrialModule",
    "adapt_batch_sampler",
    "data_length",
    "init",
    "lightning_trial",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
    "__version__",
]
