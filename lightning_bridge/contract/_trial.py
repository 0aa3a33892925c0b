"""`PyTorchTrial`: the abstract contract a user's trial implements.

A trial builds its models, optimizers and schedulers in `__init__` through the context, trains
one batch in `train_batch`, and evaluates with exactly one of `evaluate_batch` or
`evaluate_full_dataset`. The bridge turns it into a Lightning module (`TrialModule`).
"""

from __future__ import annotations

import abc
import inspect
from typing import TYPE_CHECKING, Any

import torch

from lightning_bridge.contract._data import data_length
from lightning_bridge.contract._reducer import Reducer

if TYPE_CHECKING:
    from lightning_bridge.contract._callback import PyTorchCallback
    from lightning_bridge.contract._context import PyTorchTrialContext


class PyTorchTrial(metaclass=abc.ABCMeta):
    """Base class of trials: override `__init__`, `train_batch`, the two data loader builders,
    and one of `evaluate_batch` / `evaluate_full_dataset`."""

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        """Build and wrap models, optimizers and LR schedulers with `context.wrap_*`."""

    @abc.abstractmethod
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor | dict:
        """Train on one batch; return the loss tensor or a dict of training metrics."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Any:
        """Return a `lightning_bridge.DataLoader` for training."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Any:
        """Return a `lightning_bridge.DataLoader` for validation."""

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Callbacks by name; the name keys their state in checkpoints."""
        return {}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Validation metrics of one batch; reduced with `evaluation_reducer()`."""
        raise NotImplementedError("override evaluate_batch() or evaluate_full_dataset()")

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        """One `Reducer` for every validation metric, or a dict of one per metric."""
        return Reducer.AVG

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        """Validation metrics over the whole validation loader (runs on the chief only)."""
        raise NotImplementedError("override evaluate_batch() or evaluate_full_dataset()")

    def get_batch_length(self, batch: Any) -> int:
        """Number of records in a batch; override for custom batch types."""
        return data_length(batch)


def is_determined_trial_base(cls: type) -> bool:
    """Determined's own `PyTorchTrial`, recognised by name without importing Determined."""
    return cls.__name__ == "PyTorchTrial" and cls.__module__.startswith("determined.")


def _is_base_trial_class(cls: type) -> bool:
    """The bridge's or Determined's `PyTorchTrial` (so trials built on either are accepted)."""
    return cls is PyTorchTrial or is_determined_trial_base(cls)


def is_trial_class(obj: Any) -> bool:
    """A class derived from the bridge's or Determined's `PyTorchTrial` or `DeepSpeedTrial`."""
    return isinstance(obj, type) and any(
        _is_base_trial_class(base) or _is_deepspeed_base(base) for base in obj.__mro__
    )


def is_deepspeed_trial_class(obj: Any) -> bool:
    """A class derived from the bridge's or Determined's `DeepSpeedTrial`."""
    return isinstance(obj, type) and any(_is_deepspeed_base(base) for base in obj.__mro__)


def _is_deepspeed_base(cls: type) -> bool:
    return cls.__name__ == "DeepSpeedTrial" and cls.__module__.startswith(
        ("determined.", "lightning_bridge.")
    )


def is_overridden(obj: Any, method: str, base_name: str = "PyTorchTrial") -> bool:
    """Whether `obj.method` is the user's own, by Determined's test of "overridden".

    The method counts as the base class's when its function was defined in a class named
    `base_name` (the bridge's and Determined's `PyTorchTrial` alike): so a subclass that sets
    `evaluate_batch = PyTorchTrial.evaluate_batch` switches a parent's `evaluate_batch` off,
    and an attribute that is not callable (`evaluate_batch = None`) counts as not defined.
    """
    fn = getattr(obj, method, None)
    if not callable(fn):
        return False
    return bool(getattr(fn, "__qualname__", "").partition(".")[0] != base_name)


def takes_batch_idx(fn: Any) -> bool:
    """Whether `evaluate_batch` accepts a `batch_idx` argument."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    if "batch_idx" in params:
        return True
    positional = [
        p
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)
