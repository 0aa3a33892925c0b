"""`PyTorchExperimentalContext`: the opt-in behaviours of `context.experimental`.

Dataset reproducibility checks and automatic device placement can be switched off, and
`use_amp()` asks for Lightning's `16-mixed` precision on a GPU (a no-op on the CPU, as in
Determined).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.contract._amp import warn_once


class _Parent(Protocol):
    """What the experimental part reads of its `PyTorchTrialContext`."""

    device: torch.device
    _scaler: Any


class PyTorchExperimentalContext:
    """Opt-in behaviours: dataset reproducibility checks and automatic device placement."""

    def __init__(self, parent: _Parent) -> None:
        self._parent = parent
        self._data_repro_checks_disabled = False
        self._auto_to_device = True
        self._auto_amp = False

    def disable_dataset_reproducibility_checks(self) -> None:
        """Allow data loader builders to return any iterable instead of a bridge DataLoader."""
        self._data_repro_checks_disabled = True

    def disable_auto_to_device(self) -> None:
        """Hand batches to `train_batch` / `evaluate_batch` without moving them to the device."""
        self._auto_to_device = False

    def use_amp(self) -> None:
        """Automatic mixed precision: Lightning's `16-mixed` plugin on a GPU (no-op on CPU)."""
        if self._parent._scaler is not None:
            raise InvalidTrialError(
                "use_amp() manages its own gradient scaler: remove the wrap_scaler() call, or "
                "keep wrap_scaler() and scale losses yourself without use_amp()."
            )
        if self._parent.device.type != "cuda":
            warn_once(
                "use_amp-cpu",
                "use_amp() has no effect without a GPU (as in Determined); for mixed precision "
                "on the CPU run with init(precision='bf16-mixed').",
            )
            return
        self._auto_amp = True
