"""Where reported metrics go: Lightning's loggers and the progress bar (fit observers).

`LoggerReports` writes them to the loggers. Training metrics are written per batch (and the
window averages of anything not reported per batch) and validation metrics once per validation,
at the batch count they belong to, under Determined's TensorBoard tag names
(`Determined/<name>`, `Determined/val_<name>`), so existing dashboards keep working.
`training_values` / `validation_values` are the single numbers a progress bar shows. Nothing is
logged while the trial has TensorBoard logging switched off.

`ProgressBar` shows the fit's progress on a tqdm bar, refreshed at a rate, not every batch.
Drawing a bar costs more than a small model's training step, so the loop touches the bar only
every `stride` batches, with the stride re-estimated from the measured batch rate so that the
bar moves about every `interval` seconds (Lightning's progress bar offers the same through its
`refresh_rate`). The bar shows batches trained out of the fit's length and, as an observer of
the fit, the latest reported window averages and validation metrics (while the trial's
TensorBoard logging is on, as for the loggers).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from lightning_bridge.translation._observer import FitObserver, Progress
from lightning_bridge.translation.services._logger_reports import (
    LoggerReports,
    log_training,
    log_validation,
    training_values,
    validation_values,
)

__all__ = [
    "LoggerReports",
    "ProgressBar",
    "log_training",
    "log_validation",
    "training_values",
    "validation_values",
]


class ProgressBar(FitObserver):
    """Batches trained, refreshed about every `interval` seconds (see the module docstring)."""

    def __init__(
        self,
        total: int | None,
        initial: int,
        interval: float = 0.5,
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        self._enabled = enabled
        self._bar: Any = tqdm(
            total=total,
            initial=initial,
            desc="Training",
            unit="batch",
            dynamic_ncols=True,
            file=sys.stderr,
            smoothing=0,
        )
        self._interval = interval
        self._metrics: dict[str, str] = {}
        self._shown = initial
        self._at = time.monotonic()
        self.next_at = initial + 1  # the batch count at which the loop calls `advance` next

    def advance(self, batches_trained: int) -> None:
        """Move the bar to `batches_trained` and pick the next batch count to refresh at."""
        now = time.monotonic()
        done = batches_trained - self._shown
        if done > 0:
            self._bar.update(done)
        rate = done / max(now - self._at, 1e-6)
        self._shown, self._at = batches_trained, now
        self.next_at = batches_trained + max(1, int(rate * self._interval))

    def show(self, metrics: dict[str, float]) -> None:
        """Show the latest reported metrics beside the bar."""
        if metrics:
            self._metrics.update({k: f"{v:.4g}" for k, v in metrics.items()})
            self._bar.set_postfix(self._metrics, refresh=False)

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        if self._enabled():
            self.show(training_values(metrics))

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        if self._enabled():
            self.show(validation_values(metrics))

    def close(self, batches_trained: int) -> None:
        self.advance(batches_trained)
        self._bar.close()
