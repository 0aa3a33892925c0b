"""`FitLoop`: `Trainer.fit`'s loop, on `lightning.Fabric`.

The loop is the trial's own, as in Determined: draw a batch, train it (`TrialCore`), ask the
`Schedule` which boundaries the batch reached and act on them in Determined's order (close the
training window, validate, checkpoint through the `Checkpointer`, end the fit), and poll its
`StopRequest` (signals, the trial's `set_stop_requested`, a searcher, a process that failed
at a boundary: the chief's hold on the checkpoint directory or its write). The engine
underneath is a `LoopEngine`: Lightning's (`FabricEngine`: strategy, precision plugin) for a
`PyTorchTrial`, DeepSpeed's own engines for a `DeepSpeedTrial`; `lightning.Trainer`'s
per-step machinery (fetchers, progress trackers, hook dispatch on every batch) is what a trial
does not need, and on small models it cost more than the step itself. Validation runs the
trial's validation loader through the same engine, in eval mode without gradients. The fit's
observers (`FitObserver`) hear of its start, reports, checkpoints and end on the chief.

Order of events, as under `lightning.Trainer` before: `on_trial_startup`, data loaders built,
`on_training_start` (after any restore), batches, `on_trial_shutdown`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from lightning_bridge._errors import CheckpointWriteError, InvalidArgumentError
from lightning_bridge.translation._observer import FitOutcome
from lightning_bridge.translation.fit._checkpointer import Checkpointer
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._launch import ENGINE_WARNINGS
from lightning_bridge.translation.fit._loop_engine import LoopEngine
from lightning_bridge.translation.fit._metric_reports import ProgressBar
from lightning_bridge.translation.fit._schedule import Boundary, Schedule
from lightning_bridge.translation.fit._trial_data import FullDatasetPass
from lightning_bridge.translation.services._stop_request import StopRequest

logger = logging.getLogger("lightning_bridge")

T = TypeVar("T")


class FitLoop:
    """Trains a `TrialCore` with Determined's `schedule` (see the module docstring)."""

    def __init__(
        self,
        core: TrialCore,
        schedule: Schedule,
        checkpointer: Checkpointer,
        *,
        searcher_asks: Callable[[], bool] | None = None,
        progress_bar: bool = True,
        profiler: Any = None,
    ) -> None:
        self.core = core
        self.schedule = schedule
        self.checkpointer = checkpointer
        self.profiler = profiler
        self._progress_bar = progress_bar
        ctx = core.context
        self.stop = StopRequest(
            ctx.distributed, trial_asks=ctx.get_stop_requested, searcher_asks=searcher_asks
        )
        self.engine: LoopEngine | None = None
        # Set when the fit ends after the current batch.
        self.should_stop = False
        self._preempted_by: str | None = None
        self._stopped_early = False

    # ----- the whole fit -----

    def run(self, start_engine: Callable[[], LoopEngine]) -> FitOutcome:
        """Start the engine (`start_engine`: launch the processes, set the trial's objects
        up, attach the engine to the core), train until the schedule or a stop request ends
        the fit, and tell the observers how it ended. Signals are caught from before the
        launch to the end."""
        core = self.core
        status = "failed"
        self.stop.install()
        try:
            with warnings.catch_warnings():
                for pattern in ENGINE_WARNINGS:
                    warnings.filterwarnings("ignore", message=pattern)
                self.engine = start_engine()
                self._fit()
            outcome = FitOutcome(
                # The searcher stopped it at the rung its signal came at: it is done.
                preempted_by=None if self.stop.by_searcher else self._preempted_by,
                stopped_early=self._stopped_early,
            )
            if core.is_chief:
                core.observers.on_end(outcome)
            status = "success"
            return outcome
        except BaseException as exc:
            if core.is_chief:
                core.observers.on_exception(exc)
            raise
        finally:
            self.stop.restore()
            core.shutdown()
            core.observers.teardown(status)
            if self.profiler is not None:
                self.profiler.describe()

    def _fit(self) -> None:
        core = self.core
        core.startup()
        core.build_data()
        bar = None
        if self._progress_bar and core.is_chief:
            total = self.schedule.total_batches(core.epoch_len)
            bar = ProgressBar(
                total, core.start_batch, enabled=core.context.get_enable_tensorboard_logging
            )
            core.observers.add(bar)
        try:
            self._start()
            self._train(bar)
        except BaseException:
            # The write in flight ends before the directory is let go.
            self.checkpointer.close(failed=True)
            self.stop.end(wait=False)
            raise
        finally:
            if bar is not None:
                bar.close(core.state.batches_trained)
        try:
            self.checkpointer.close(failed=False)
        except BaseException:
            self.stop.end(wait=False)
            raise
        self.stop.end()

    def _start(self) -> None:
        """Before the first batch: hold the checkpoint directory, restore, maybe validate."""
        core = self.core
        self._agreed(lambda: self.checkpointer.hold(core), InvalidArgumentError)
        self.stop.begin()
        if core.is_chief:
            core.observers.on_fit_start()
        core.begin_training()
        if self.schedule.validates_at_start(core.state.batches_trained):
            self._validate()
        if self._remaining() <= 0:
            self._finish()

    # ----- training -----

    def _train(self, bar: ProgressBar | None) -> None:
        core, checkpointer = self.core, self.checkpointer
        train = self._batch_step()
        after_batch: Callable[[int], None] = self._after_batch
        if self.profiler is not None:
            after_batch = _profiled(self.profiler, "[FitLoop].after_batch", after_batch)
        while not self.should_stop:
            train()
            done = core.state.batches_trained
            after_batch(done)
            if checkpointer.busy:
                checkpointer.advance(training_goes_on=not self.should_stop)
            if bar is not None and done >= bar.next_at:
                bar.advance(done)

    def _batch_step(self) -> Callable[[], None]:
        """Draw the next batch and train it: a plain call on one device without autocast,
        else through the engine; inside the profiler's sections when profiling."""
        core, engine, profiler = self.core, self.engine, self.profiler
        assert engine is not None
        iterator: Iterator[Any] | None = core.train_iterator
        assert iterator is not None
        train_batch, run = core.train_batch, engine.run
        if profiler is not None:

            def profiled() -> None:
                with profiler.profile("run_training_batch"):
                    batch = next(iterator)
                    with profiler.profile("training_step"):
                        run(train_batch, batch)

            return profiled
        if engine.direct:
            return lambda: train_batch(next(iterator))
        return lambda: run(train_batch, next(iterator))

    def _after_batch(self, batches_trained: int) -> None:
        """Act on the boundaries the batch reached, in order; end the fit where the schedule
        or a stop request says so."""
        core = self.core
        # Every process polls after every batch (the agreement is a collective).
        stop_signal = self.stop.poll()
        reached = self.schedule.reached(batches_trained, core.epoch_len)
        if reached:
            core.close_training_window()
            state = core.state
            for kind in reached:
                if kind is Boundary.VALIDATE and not state.validation_is_current:
                    self._validate()
                elif kind is Boundary.CHECKPOINT and not state.checkpoint_is_current:
                    self._save()
                elif kind in (Boundary.LENGTH, Boundary.REPORT):
                    logger.debug("Trained %d batches", state.batches_trained)
                if self.stop.early():
                    self._end(early=True)
                    return
        if self._remaining() <= 0:
            self._finish()
        elif stop_signal:
            self._preempted_by = signal.Signals(stop_signal).name
            if core.window_open:
                core.close_training_window()
            self._end(early=True)

    def _remaining(self) -> int:
        state = self.core.state
        return self.schedule.remaining(state.batches_trained, state.epochs_trained)

    def _finish(self) -> None:
        """The fit reached its length: a last validation and checkpoint unless current."""
        if not self.core.state.validation_is_current:
            self._validate()
        self._end(early=False)

    def _end(self, early: bool) -> None:
        """Checkpoint (unless current) and wait for it: the fit ends after this batch."""
        core = self.core
        if not core.state.checkpoint_is_current:
            self._save()
        self._agreed(lambda: self.checkpointer.settle(core), CheckpointWriteError)
        self._stopped_early = self._stopped_early or early
        self.should_stop = True

    # ----- checkpoints -----

    def _save(self, metrics: dict[str, Any] | None = None) -> None:
        """Checkpoint (the chief writes); every process learns its id, or that it failed."""
        core = self.core
        storage_id = self._agreed(
            lambda: self.checkpointer.save(core, metrics), CheckpointWriteError
        )
        for cb in core.trial_callbacks.values():
            cb.on_checkpoint_upload_end(uuid=storage_id)

    def _agreed(self, part: Callable[[], T], error: type[Exception]) -> T:
        """This process's `part` of a boundary at which it may fail alone with `error`; the
        `StopRequest` has every process agree whether one did (then all raise it) and hands
        every process the chief's result."""
        value: Any = None
        failure = None
        try:
            value = part()
        except error as exc:
            failure = str(exc)
        result: T = self.stop.agree(failure, error, value)
        return result

    # ----- validation -----

    def _validate(self) -> None:
        """Validate; checkpoint if the policy wants this validation; hear the searcher."""
        core = self.core
        self.run_validation()
        metrics = core.last_validation_metrics or {}
        if self.checkpointer.wants(core, metrics):
            self._save(metrics)
        self.stop.after_validation()

    def run_validation(self) -> None:
        """One validation pass over the trial's validation data (every process its shard)."""
        core, engine, profiler = self.core, self.engine, self.profiler
        assert engine is not None
        loader: Any = core.val_loader if core.evaluates_batches else FullDatasetPass()
        limit = 1 if core.test_mode else None
        section: Callable[[str], Any] = (
            profiler.profile if profiler is not None else lambda name: contextlib.nullcontext()
        )
        if profiler is not None:
            profiler.start("run_validation")
        try:
            with engine.evaluating(core.context.models):
                core.start_validation()
                for batch_idx, batch in enumerate(loader):
                    if limit is not None and batch_idx >= limit:
                        break
                    with section("validation_step"):
                        engine.run(core.validate_batch, batch, batch_idx)
                core.end_validation(engine.device)
        finally:
            if profiler is not None:
                profiler.stop("run_validation")


def _profiled(profiler: Any, name: str, fn: Callable[[int], None]) -> Callable[[int], None]:
    def profiled(batches_trained: int) -> None:
        with profiler.profile(name):
            fn(batches_trained)

    return profiled


def model_summary(models: list[torch.nn.Module]) -> str:
    """One line per wrapped model: its type and parameter counts."""
    from lightning.pytorch.utilities.model_summary import get_human_readable_count

    lines = []
    for i, model in enumerate(models):
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        lines.append(
            f"model {i}: {type(model).__name__}, {get_human_readable_count(total)} parameters "
            f"({get_human_readable_count(trainable)} trainable)"
        )
    return "\n".join(lines)
