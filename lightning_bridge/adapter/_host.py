"""`AdapterHost`: what the adapter's stand-in trainer and callback need of the adapter.

The stand-in trainer (`_trainer`) and the trainer-facing callback (`_callback`) call back into
the `LightningAdapter` that owns them; this protocol names those calls so neither module has
to import the adapter itself.
"""

from __future__ import annotations

from typing import Any, Protocol

import lightning.pytorch as pl
import torch


class AdapterHost(Protocol):
    """The adapter as its stand-in trainer and callback see it."""

    context: Any
    lightning_module: pl.LightningModule
    datamodule: pl.LightningDataModule | None
    _log: Any
    _trainer: Any
    _pending_plateau: bool

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Run a module hook under its own name (what `self.log` checks)."""

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """`manual_backward` / automatic backward through the trial context."""

    def _optimizer_step(self, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
        """`optimizer.step(closure)` through the trial context."""

    def _flush_plateau(self) -> None:
        """Step ReduceLROnPlateau schedulers that waited for a validation metric."""
