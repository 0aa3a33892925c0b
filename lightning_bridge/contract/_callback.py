"""`PyTorchCallback`: hooks a trial registers through `build_callbacks()`.

The bridge calls them at Determined's moments and in Determined's order; every hook defaults
to doing nothing so a callback overrides only what it needs.
"""

from __future__ import annotations

from typing import Any


class PyTorchCallback:
    """Base class of trial callbacks; override the hooks you need."""

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        """Before data loaders are built; `first_batch_idx` is the batch training resumes at."""

    def on_trial_shutdown(self) -> None:
        """When the fit ends, normally or by an error (called in reverse registration order)."""

    def on_training_start(self) -> None:
        """After any checkpoint is restored, right before the first batch."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of each epoch."""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of each epoch."""

    def on_training_workload_end(
        self, avg_metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        """After each reporting window, with its averaged and per-batch training metrics."""

    def on_validation_start(self) -> None:
        """Before validation, models already in eval mode."""

    def on_validation_epoch_start(self) -> None:
        """Before the first validation batch (evaluate_batch trials only)."""

    def on_validation_epoch_end(self, outputs: list[Any]) -> None:
        """After the last validation batch, with every batch's metrics."""

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        """After validation, with the reduced validation metrics."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        """Before a loaded `state_dict.pth` is applied to the trial."""

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        """Before `state_dict.pth` is written; the callback may add entries."""

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        """Deprecated alias of `on_checkpoint_write_end`."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """After a checkpoint's files are written to `checkpoint_dir`."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """After the checkpoint is stored, with its id."""

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints under this callback's name."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


def overrides(callback: Any, hook: str) -> bool:
    """Whether `callback`'s class implements `hook` itself (rather than inheriting the no-op
    of the bridge's or Determined's `PyTorchCallback`)."""
    for cls in type(callback).__mro__:
        if hook in vars(cls):
            base = cls is PyTorchCallback or (
                cls.__name__ == "PyTorchCallback" and cls.__module__.startswith("determined.")
            )
            return not base
    return False
