"""`AdapterHost`: what the adapter's stand-in trainer and callback need of the adapter.

The stand-in trainer (`_trainer`) and the trainer-facing callback (`_callback`) call back into
the `LightningAdapter` that owns them; this protocol names those calls so neither module has
to import the adapter itself.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class AdapterHost(Protocol):
    """The adapter as its stand-in trainer and callback see it."""

    context: Any
    lightning_module: Any
    datamodule: Any
    _log: Any
    _trainer: Any
    _callbacks: Any
    _has_validation: bool
    _pending: list[str]

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Run a module hook under its own name (what `self.log` checks)."""

    def _hook(self, hook: str, *args: Any) -> Any:
        """Run a hook of the Lightning callbacks, then the module's."""

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """`manual_backward` / automatic backward through the trial context."""

    def _optimizer_step(self, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
        """`optimizer.step(closure)` through the trial context."""

    def _flush(self) -> None:
        """Run what waited for a validation that did not come (plateau steps, epoch end)."""

    def _end_epoch(self) -> None:
        """The end of a training epoch, as Lightning's fit loop runs it."""

    def _validation_start(self) -> None:
        """Validation begins: eval mode and the start hooks."""

    def _validation_epoch_end(self) -> None:
        """The validation pass is over: the epoch-end hooks and its values."""

    def _validation_end(self) -> None:
        """Validation is over: end hooks, train mode, then what waited for it."""

    def _training_epoch_len(self) -> int | None:
        """Batches per epoch of the training loader (built now if not yet)."""

    def _training_loader(self) -> Any:
        """The module's training loader (built now if not yet)."""
