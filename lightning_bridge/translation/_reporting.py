"""Where reported metrics go: Lightning's loggers, and what the progress bar shows.

Training metrics are written per batch (and the window averages of anything not reported per
batch) and validation metrics once per validation, at the batch count they belong to, under
Determined's TensorBoard tag names (`Determined/<name>`, `Determined/val_<name>`), so existing
dashboards keep working. Both functions return the values for the progress bar: the latest
window averages and validation metrics.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lightning_bridge.translation._metrics import scalar_items

TAG_PREFIX = "Determined/"


def _tagged(values: dict[str, float]) -> dict[str, float]:
    return {f"{TAG_PREFIX}{k}": v for k, v in values.items()}


def report_training(
    loggers: Iterable[Any],
    avg: dict[str, Any],
    batch_metrics: list[dict[str, Any]],
    batches_trained: int,
) -> dict[str, float]:
    """Log a closed training window to Lightning `loggers`; returns the progress-bar values."""
    first = batches_trained - len(batch_metrics)
    seen: set[str] = set()
    for metrics in batch_metrics:
        seen.update(metrics)
    rest = scalar_items({k: v for k, v in avg.items() if k not in seen})
    for logger in loggers:
        for i, metrics in enumerate(batch_metrics):
            values = scalar_items(metrics)
            if values:
                logger.log_metrics(_tagged(values), step=first + i)
        if rest:
            logger.log_metrics(_tagged(rest), step=batches_trained)
    return scalar_items(avg)


def report_validation(
    loggers: Iterable[Any], metrics: dict[str, Any], batches_trained: int
) -> dict[str, float]:
    """Log reduced validation metrics to Lightning `loggers`; returns the progress-bar values."""
    named = {
        (k if k.startswith("val") else f"val_{k}"): v for k, v in scalar_items(metrics).items()
    }
    if named:
        for logger in loggers:
            logger.log_metrics(_tagged(named), step=batches_trained)
    return named
