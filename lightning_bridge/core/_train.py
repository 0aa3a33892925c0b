"""`core_context.train`: a Core API script's metrics. Off `lightning-bridge run` they are
logged, as Determined's off-cluster mode does."""

from __future__ import annotations

import enum
import logging
import pathlib
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("lightning_bridge.core")


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TrainContext:
    """Reports training/validation metrics, progress and status (logged off a run)."""

    def __init__(self, tensorboard_path: pathlib.Path | None = None) -> None:
        self._tensorboard_path = tensorboard_path

    def set_status(self, status: str) -> None:
        logger.info("status: %s", status)

    # Each report is logged in the words Determined's off-cluster mode logs it.
    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        logger.info(
            "report_metrics(group=%s, steps_completed=%s, metrics=%s)",
            group,
            steps_completed,
            metrics,
        )

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        logger.info(
            "report_training_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics
        )

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        logger.info(
            "report_validation_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics
        )

    def report_progress(self, progress: float) -> None:
        logger.info("report_progress with progress=%s", progress)

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        logger.info("report_early_exit(%s)", EarlyExitReason(reason))

    def get_experiment_best_validation(self) -> float | None:
        """The experiment's best searcher metric (none off a run)."""
        return None

    def get_tensorboard_path(self) -> pathlib.Path | None:
        return self._tensorboard_path

    def upload_tensorboard_files(
        self,
        selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, _: p,
    ) -> None:
        """Nothing to upload off a run: the files stay at `get_tensorboard_path()`."""
        logger.info("upload_tensorboard_files(): the files stay where they were written")
