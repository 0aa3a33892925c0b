"""Run Determined `PyTorchTrial` / Trainer-API code on PyTorch Lightning.

`import lightning_bridge as pytorch` stands in for `from determined import pytorch`: the same
names, the same semantics, with Lightning's engine (strategies, precision, loggers, progress
bars, profilers) underneath. `TrialModule` is the generated LightningModule, usable with any
`lightning.Trainer`.
"""

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from . import samplers
from ._callback import PyTorchCallback
from ._context import PyTorchExperimentalContext, PyTorchTrialContext
from ._data import DataLoader, TorchData, data_length, to_device
from ._distributed import DistributedContext
from ._errors import BridgeError, InvalidArgumentError, InvalidCheckpointError, InvalidTrialError
from ._load import load_trial_from_checkpoint_path
from ._lr_scheduler import LRScheduler
from ._module import TrialModule
from ._reducer import MetricReducer, Reducer
from ._trainer import Trainer, init
from ._trial import PyTorchTrial
from ._units import Batch, Epoch, TrainUnit

if TYPE_CHECKING:
    from ._adapter import LightningAdapter, lightning_trial

# The Lightning adapter reuses Lightning's private helpers; it is imported on first use so
# that a Lightning release which moved one breaks only the adapter, with its own message.
_LAZY = {"LightningAdapter", "lightning_trial"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import _adapter

        return getattr(_adapter, name)
    raise AttributeError(f"module 'lightning_bridge' has no attribute {name!r}")


__all__ = [
    "Batch",
    "BridgeError",
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
