"""`FitObserver`: what happens beside training, told of the fit's events.

The run record, the search report, Lightning's loggers and the progress bar observe a fit the
way Lightning callbacks observe a `lightning.Trainer`: the fit notifies them (`FitObservers`
calls each in the order added) and they never reach back into it. Every hook has a no-op
default, so an observer implements only what it needs. A fit's observers are those of its
chief process: only the chief reports.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far the fit has trained when an event happens."""

    batches: int
    epochs: int


@dataclasses.dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint now complete in the checkpoint directory."""

    path: pathlib.Path
    progress: Progress
    # The validation metrics it was taken after (None: not after a validation).
    metrics: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class FitOutcome:
    """How a fit that did not fail ended."""

    # The signal that stopped it (SIGTERM / SIGINT), None when it ran to its end or stopped
    # early; a searcher's stop counts as an end.
    preempted_by: str | None = None
    # It stopped before its length: asked by the trial, the searcher or a signal.
    stopped_early: bool = False


class FitObserver:
    """Hooks called at the fit's events (Lightning-callback style); all optional."""

    def on_fit_start(self) -> None:
        """Training is about to begin (the checkpoint directory is held; a restore and
        `on_training_start` follow)."""

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        """A training window closed: its averages and per-batch metrics."""

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        """A validation's reduced metrics (after the trial's `on_validation_end`)."""

    def on_checkpoint(self, checkpoint: SavedCheckpoint) -> None:
        """A checkpoint is durable (retention is applied after the observers have it)."""

    def on_end(self, outcome: FitOutcome) -> None:
        """The fit ended without an error."""

    def on_exception(self, exception: BaseException) -> None:
        """The fit raised `exception`."""

    def teardown(self, status: str) -> None:
        """Release what the observer holds; `status` is "success" or "failed"."""


class FitObservers(FitObserver):
    """A fit's observers, notified in the order they were added."""

    def __init__(self, observers: list[FitObserver] | None = None) -> None:
        self._observers: list[FitObserver] = list(observers or [])

    def add(self, observer: FitObserver) -> None:
        self._observers.append(observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def on_fit_start(self) -> None:
        for observer in self._observers:
            observer.on_fit_start()

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        for observer in self._observers:
            observer.on_training_report(progress, metrics, batch_metrics)

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        for observer in self._observers:
            observer.on_validation(progress, metrics)

    def on_checkpoint(self, checkpoint: SavedCheckpoint) -> None:
        for observer in self._observers:
            observer.on_checkpoint(checkpoint)

    def on_end(self, outcome: FitOutcome) -> None:
        for observer in self._observers:
            observer.on_end(outcome)

    def on_exception(self, exception: BaseException) -> None:
        for observer in self._observers:
            observer.on_exception(exception)

    def teardown(self, status: str) -> None:
        """Every observer's teardown runs, even when one fails (the first error is raised)."""
        error: BaseException | None = None
        for observer in self._observers:
            try:
                observer.teardown(status)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the others
                error = error or exc
        if error is not None:
            raise error
