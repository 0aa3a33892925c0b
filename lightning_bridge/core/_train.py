"""`core_context.train`: a Core API script's metrics. Off `lightning-bridge run` they are
logged, as Determined's off-cluster mode does; under it they also go to the trial's services
(`CoreRun`: the record, a search, TensorBoard, the MLflow mirror)."""

from __future__ import annotations

import enum
import json
import logging
import pathlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_bridge.core._run import CoreRun

logger = logging.getLogger("lightning_bridge.core")


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TrainContext:
    """Reports training/validation metrics, progress and status: logged, and recorded by the
    chief when `lightning-bridge run` started the script (`run`)."""

    def __init__(
        self,
        tensorboard_path: pathlib.Path | None = None,
        run: CoreRun | None = None,
        manual_tensorboard: bool = False,
    ) -> None:
        self._tensorboard_path = tensorboard_path
        self._run = run
        self._manual_tensorboard = manual_tensorboard
        self._metadata: dict[str, Any] | None = None  # off a run: as last set

    def _reporting(self) -> CoreRun | None:
        """The run to report to: the chief's (Determined's other workers report nothing)."""
        run = self._run
        return run if run is not None and run.is_chief else None

    def set_status(self, status: str) -> None:
        """A short line saying what the trial is working on: logged, and (the chief, under
        `lightning-bridge run`) recorded, where `experiment describe` shows it."""
        logger.info("status: %s", status)
        run = self._reporting()
        if run is not None:
            run.report_run(status=str(status))

    def set_metadata(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Replace the trial's run metadata (Determined's limits checked: keys up to 50
        characters without `$ . [ ]`, 10 levels, arrays of 100, strings of 5,000, 1,000
        values); returns it. Under `lightning-bridge run` it is recorded and outlives the run;
        off it, the process keeps it."""
        logger.debug("set_metadata(%s)", metadata)
        kept = _checked_metadata(metadata)
        if self._run is not None:
            self._run.report_run(run_metadata=kept)
        else:
            self._metadata = kept
        return json.loads(json.dumps(kept))

    def get_metadata(self) -> dict[str, Any] | None:
        """The trial's run metadata as last set (None: never)."""
        kept = self._run.run_metadata() if self._run is not None else self._metadata
        return None if kept is None else json.loads(json.dumps(kept))

    # Each report is logged in the words Determined's off-cluster mode logs it.
    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        logger.info(
            "report_metrics(group=%s, steps_completed=%s, metrics=%s)",
            group,
            steps_completed,
            metrics,
        )
        run = self._reporting()
        if run is None:
            return
        if group == "training":
            run.training(steps_completed, metrics, None)
        elif group == "validation":
            run.validation(steps_completed, _reportable(metrics))
        else:
            if "." in group:
                raise ValueError(f"metric group {group!r}: a group name cannot contain '.'")
            run.other(group, steps_completed, metrics)

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: dict[str, Any],
        batch_metrics: list[dict[str, Any]] | None = None,
    ) -> None:
        logger.info(
            "report_training_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics
        )
        run = self._reporting()
        if run is not None:
            run.training(steps_completed, metrics, batch_metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any]) -> None:
        logger.info(
            "report_validation_metrics(steps_completed=%s, metrics=%s)", steps_completed, metrics
        )
        run = self._reporting()
        if run is not None:
            run.validation(steps_completed, _reportable(metrics))

    def report_progress(self, progress: float) -> None:
        """The fraction of training done (0 to 1): logged, and (the chief, under
        `lightning-bridge run`) recorded, where `experiment describe` and `list` show it."""
        if self._run is not None and not 0 <= progress <= 1:
            raise ValueError(f"Progress should be between 0 and 1, not {progress}")
        logger.info("report_progress with progress=%s", progress)
        run = self._reporting()
        if run is not None:
            run.report_run(progress=float(progress))

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """The script ends before its length: its hyperparameters cannot train (INVALID_HP:
        a search replaces the trial where Determined's does) or it chose to stop."""
        reason = EarlyExitReason(reason)
        logger.info("report_early_exit(%s)", reason)
        run = self._reporting()
        if run is not None:
            run.early_exit_reason = reason.value

    def get_experiment_best_validation(self) -> float | None:
        """The experiment's best searcher metric so far (none off a run)."""
        run = self._run
        return run.best_validation() if run is not None else None

    def get_tensorboard_path(self) -> pathlib.Path | None:
        """Where the trial's TensorBoard files go (the run's `tensorboard/` folder)."""
        return self._run.tensorboard_dir if self._run is not None else self._tensorboard_path

    def upload_tensorboard_files(
        self,
        selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, _: p,
    ) -> None:
        """TensorboardMode.MANUAL's upload. The bridge keeps a trial's TensorBoard files in
        its run folder, where `get_tensorboard_path()` points: they stay there."""
        if self._run is not None and not self._manual_tensorboard:
            raise RuntimeError("upload_tensorboard_files can only be used in MANUAL mode")
        logger.info("upload_tensorboard_files(): the files stay where they were written")


def _reportable(metrics: dict[str, Any]) -> dict[str, Any]:
    """Validation metrics as Determined records them: a None value is an error, bytes are
    left out with a warning."""
    kept: dict[str, Any] = {}
    for name, value in metrics.items():
        if value is None:
            raise RuntimeError(f"Validation metric '{name}' returned an invalid scalar value: None")
        if isinstance(value, (bytes, bytearray)):
            logger.warning("Removed non serializable metrics: %s", name)
            continue
        kept[name] = value
    return kept


# Determined's limits on run metadata (its master refuses what exceeds them).
_METADATA_KEY_CHARS = 50
_METADATA_DEPTH = 10
_METADATA_ARRAY = 100
_METADATA_STRING = 5000
_METADATA_VALUES = 1000
_METADATA_BAD_KEY = re.compile(r"[$.\[\]]")


def _checked_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """`metadata` as JSON keeps it, checked against Determined's limits: a ValueError that
    names the limit otherwise."""
    if not isinstance(metadata, dict):
        raise ValueError(f"run metadata is a dict, not {type(metadata).__name__}")
    try:
        kept = json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"run metadata must be JSON: {exc}") from None
    values = 0

    def walk(value: Any, depth: int, in_array: bool = False) -> None:
        nonlocal values
        if depth > _METADATA_DEPTH:
            raise ValueError(f"metadata exceeds maximum nesting depth of {_METADATA_DEPTH}")
        if isinstance(value, dict) and value and not in_array:  # an array's object: one value
            for key, item in value.items():
                if len(key) > _METADATA_KEY_CHARS:
                    raise ValueError(
                        f"metadata key exceeds maximum length of {_METADATA_KEY_CHARS} "
                        f"characters: {key[:60]!r}"
                    )
                if _METADATA_BAD_KEY.search(key):
                    raise ValueError(
                        f"metadata keys can not contain the following character(s): $ . [ ] "
                        f"({key!r})"
                    )
                walk(item, depth + 1)
        elif isinstance(value, list) and value:
            if len(value) > _METADATA_ARRAY:
                raise ValueError(
                    f"metadata array exceeds maximum length of {len(value)}/{_METADATA_ARRAY} "
                    "elements"
                )
            for item in value:
                walk(item, depth + 1, in_array=True)
        else:
            if isinstance(value, str) and len(value) > _METADATA_STRING:
                raise ValueError(
                    f"metadata value exceeds maximum length of {_METADATA_STRING} characters"
                )
            values += 1
            if values > _METADATA_VALUES:
                raise ValueError(
                    f"request exceeds run metadata key count limit of {_METADATA_VALUES}"
                )

    walk(kept, 0)
    return kept
