"""Where reported metrics go: Lightning's loggers and its progress bar.

Training metrics are written per batch (and the window averages of anything not reported per
batch) and validation metrics once per validation, at the batch count they belong to, under
Determined's TensorBoard tag names (`Determined/<name>`, `Determined/val_<name>`), so existing
dashboards keep working. The progress bar shows the latest window averages and validation.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lightning_bridge.translation._metrics import scalar_items

TAG_PREFIX = "Determined/"


def _tagged(values: dict[str, float]) -> dict[str, float]:
    return {f"{TAG_PREFIX}{k}": v for k, v in values.items()}


def report_training(
    module: pl.LightningModule,
    avg: dict[str, Any],
    batch_metrics: list[dict[str, Any]],
    batches_trained: int,
) -> None:
    """Log a closed training window (call from a training-batch hook of the module)."""
    first = batches_trained - len(batch_metrics)
    seen: set[str] = set()
    for metrics in batch_metrics:
        seen.update(metrics)
    rest = scalar_items({k: v for k, v in avg.items() if k not in seen})
    for logger in module.trainer.loggers:
        for i, metrics in enumerate(batch_metrics):
            values = scalar_items(metrics)
            if values:
                logger.log_metrics(_tagged(values), step=first + i)
        if rest:
            logger.log_metrics(_tagged(rest), step=batches_trained)
    bar = scalar_items(avg)
    if bar:
        module.log_dict(
            bar, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1
        )


def report_validation(
    module: pl.LightningModule, metrics: dict[str, Any], batches_trained: int
) -> None:
    """Log reduced validation metrics (call from the module's validation-epoch-end hook)."""
    named = {
        (k if k.startswith("val") else f"val_{k}"): v for k, v in scalar_items(metrics).items()
    }
    if not named:
        return
    for logger in module.trainer.loggers:
        logger.log_metrics(_tagged(named), step=batches_trained)
    module.log_dict(named, prog_bar=True, logger=False, batch_size=1)
