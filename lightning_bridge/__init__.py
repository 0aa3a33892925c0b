"""Run Determined `PyTorchTrial` / Trainer-API code on PyTorch Lightning.

`import lightning_bridge as pytorch` stands in for `from determined import pytorch`: the same
names, the same semantics, with Lightning's engine (strategies, precision, loggers, progress
bars, profilers) underneath. `TrialModule` is the generated LightningModule, usable with any
`lightning.Trainer`.
"""

from typing import TYPE_CHECKING, Any

from lightning_bridge import samplers
from lightning_bridge._errors import (
    BridgeError,
    CheckpointWriteError,
    InvalidArgumentError,
    InvalidCheckpointError,
    InvalidTrialError,
)
from lightning_bridge._version import __version__
from lightning_bridge.contract._callback import PyTorchCallback
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._data import DataLoader, TorchData, data_length, to_device
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._experimental import PyTorchExperimentalContext
from lightning_bridge.contract._load import load_trial_from_checkpoint_path
from lightning_bridge.contract._lr_scheduler import LRScheduler
from lightning_bridge.contract._reducer import MetricReducer, Reducer
from lightning_bridge.contract._trial import PyTorchTrial
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.translation._init import init
from lightning_bridge.translation._module import TrialModule
from lightning_bridge.translation._trainer import Trainer

if TYPE_CHECKING:
    from lightning_bridge.adapter._classes import LightningAdapter, lightning_trial

# The Lightning adapter reuses Lightning's private helpers; it is imported on first use so
# that a Lightning release which moved one breaks only the adapter, with its own message.
_LAZY = {"LightningAdapter", "lightning_trial"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from lightning_bridge.adapter import _classes

        return getattr(_classes, name)
    raise AttributeError(f"module 'lightning_bridge' has no attribute {name!r}")


__all__ = [
    "Batch",
    "BridgeError",
    "CheckpointWriteError",
    "DataLoader",
    "DistributedContext",
    "Epoch",
    "InvalidArgumentError",
    "InvalidCheckpointError",
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
    "data_length",
    "init",
    "lightning_trial",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
    "__version__",
]
