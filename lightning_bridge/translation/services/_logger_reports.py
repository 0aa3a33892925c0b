"""Reported metrics written to Lightning's loggers (a fit observer, and the Core API's reports).

`LoggerReports` writes them to the loggers. Training metrics are written per batch (and the
window averages of anything not reported per batch) and validation metrics once per validation,
at the batch count they belong to, under Determined's TensorBoard tag names
(`Determined/<name>`, `Determined/val_<name>`), so existing dashboards keep working.
`training_values` / `validation_values` are the single numbers a progress bar shows. Nothing is
logged while TensorBoard logging is switched off. `run_loggers` makes the loggers a run writes
to: TensorBoard's when it is installed, else a CSV file.
"""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

from lightning_bridge.translation._observer import FitObserver, Progress
from lightning_bridge.translation._values import scalar_items

TAG_PREFIX = "Determined/"


def _tagged(values: dict[str, float]) -> dict[str, float]:
    return {f"{TAG_PREFIX}{k}": v for k, v in values.items()}


def training_values(avg: dict[str, Any]) -> dict[str, float]:
    """A training window's averages that are single numbers."""
    return scalar_items(avg)


def validation_values(metrics: dict[str, Any]) -> dict[str, float]:
    """Validation metrics that are single numbers, named `val_<name>`."""
    return {(k if k.startswith("val") else f"val_{k}"): v for k, v in scalar_items(metrics).items()}


def log_training(
    loggers: Iterable[Any],
    avg: dict[str, Any],
    batch_metrics: list[dict[str, Any]],
    batches_trained: int,
) -> None:
    """Log a closed training window to Lightning `loggers`."""
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


def log_validation(loggers: Iterable[Any], metrics: dict[str, Any], batches_trained: int) -> None:
    """Log reduced validation metrics to Lightning `loggers`."""
    named = validation_values(metrics)
    if named:
        for logger in loggers:
            logger.log_metrics(_tagged(named), step=batches_trained)


class LoggerReports(FitObserver):
    """Writes the fit's reports to Lightning loggers and closes them when it ends."""

    def __init__(self, loggers: list[Any], enabled: Callable[[], bool]) -> None:
        self._loggers = loggers
        self._enabled = enabled  # the trial's TensorBoard logging switch

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        if self._enabled():
            log_training(self._loggers, metrics, batch_metrics, progress.batches)

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        if self._enabled():
            log_validation(self._loggers, metrics, progress.batches)

    def teardown(self, status: str) -> None:
        for fit_logger in self._loggers:
            fit_logger.finalize(status)


def tensorboard_installed() -> bool:
    """Whether the tensorboard package is installed. A folder named `tensorboard` on
    `sys.path` (old logs beside a script) imports as an empty namespace package and must not
    count: Lightning's TensorBoard logger would then fail."""
    try:
        spec = importlib.util.find_spec("tensorboard")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def run_loggers(
    run_dir: pathlib.Path, tensorboard_dir: pathlib.Path, lightning: bool = True
) -> list[Any]:
    """The loggers a run writes its metrics to: TensorBoard's in `tensorboard_dir` when
    installed, else Lightning's CSV logger under `run_dir/csv_logs`. A fit gets Lightning's
    TensorBoard logger; a Core API script (`lightning=False`), which trains without Lightning,
    gets TensorBoard's own writer (`EventWriter`), so that its start does not import Lightning."""
    if not tensorboard_installed():
        from lightning.pytorch.loggers import CSVLogger

        return [CSVLogger(save_dir=str(run_dir), name="csv_logs", version="")]
    if not lightning:
        return [EventWriter(tensorboard_dir)]
    from lightning.pytorch.loggers import TensorBoardLogger

    return [TensorBoardLogger(save_dir=str(tensorboard_dir), name="", version="")]


class EventWriter:
    """TensorBoard's event writer (`torch.utils.tensorboard.SummaryWriter`, the one Lightning's
    TensorBoard logger and Determined's Core API write with) behind the two calls of a logger
    that `log_training` / `log_validation` make. Its file is opened at the first metric, as
    Lightning's logger opens it. Importing Lightning would cost a Core API script's start
    seconds of CPU for this alone."""

    def __init__(self, log_dir: pathlib.Path) -> None:
        self._log_dir = log_dir
        self._writer: Any = None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self._log_dir))
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)

    def finalize(self, status: str) -> None:
        """Write what is buffered and close the file (`status` as Lightning's loggers get it)."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
