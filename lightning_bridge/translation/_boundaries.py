"""`TrialBoundaries`: Determined's training schedule, checked by the fit loop after each batch.

After every batch it checks the four boundaries in Determined's order (training length,
validation period, checkpoint period, reporting period). When any is reached the reporting
window closes, then validation, checkpoint and the stop request are handled in that order;
when the training length is reached, a final validation and checkpoint run (unless current)
and the loop is told to stop. The loop calls it at the moments of Lightning's callback hooks of
the same names (`trainer` is the loop, `pl_module` the trial's `TrialCore`). Checkpoints go
through the loop's `CheckpointWriter`; one counts (in `checkpoints`, for retention and in the
run's record) once it is durable; when the fit ends the boundaries wait for the last one, so
every process learns whether it failed. A SIGTERM / SIGINT stop (agreed by every process, see
`_stop`) comes after the batch's boundaries, so a stopped run has validated and checkpointed
exactly what an uninterrupted one had at that batch. In a search, the trial also validates at
its rung lengths and reports each validation to the searcher, whose stop ends the fit like a
preemption.
"""

from __future__ import annotations

import enum
import functools
import logging
import pathlib
import signal
from typing import TYPE_CHECKING, Any, Protocol

from lightning_bridge._errors import CheckpointWriteError, InvalidArgumentError, TrialRuntimeError
from lightning_bridge.checkpoint._async import CheckpointWriter
from lightning_bridge.checkpoint._claim import DirectoryClaim
from lightning_bridge.checkpoint._layout import EXTRAS_KEY
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._writable import directory_bytes, space_shortfall, write_failure
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.translation._core import TrialCore
from lightning_bridge.translation._metrics import searcher_value
from lightning_bridge.translation._payload import capture_rng_state, save_checkpoint
from lightning_bridge.translation._stop import StopRequest

if TYPE_CHECKING:  # only runs started by the command have them (see `Trainer`)
    from lightning_bridge.translation._run_record import RunRecord
    from lightning_bridge.translation._search_report import SearchReport

logger = logging.getLogger("lightning_bridge")


# The checkpoints kept before a checkpoint (retention), in the payload's bridge entry.
RETENTION_KEY = "retention"


class _Kind(enum.Enum):
    TRAIN = "train"
    VALIDATE = "validate"
    CHECKPOINT = "checkpoint"
    REPORT = "report"


class Loop(Protocol):
    """What the boundaries need of the loop running the fit."""

    should_stop: bool

    def run_validation(self) -> None: ...


class TrialBoundaries:
    """Validation, checkpoints, reporting and stopping at Determined's batch boundaries."""

    def __init__(
        self,
        *,
        max_length: TrainUnit,
        validation_period: TrainUnit,
        checkpoint_period: TrainUnit,
        reporting_period: TrainUnit,
        checkpoint_policy: str,
        checkpoint_dir: pathlib.Path,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        retention: CheckpointRetention | None = None,
        record: RunRecord | None = None,
        search: SearchReport | None = None,
        writer: CheckpointWriter | None = None,
    ) -> None:
        self._length: TrainUnit = Batch(1) if test_mode else max_length
        self._boundaries = [
            (_Kind.TRAIN, max_length),
            (_Kind.VALIDATE, validation_period),
            (_Kind.CHECKPOINT, checkpoint_period),
            (_Kind.REPORT, reporting_period),
        ]
        self._policy = checkpoint_policy
        self._checkpoint_dir = checkpoint_dir
        self._step_zero_validation = step_zero_validation
        self._test_mode = test_mode
        self._searcher_metric = searcher_metric
        self._smaller_is_better = smaller_is_better
        self._best: float | None = None
        self._retention = retention
        self._run_record = record
        self._search = search
        self._writer = writer
        self.search_stopped = False
        self.checkpoints: list[pathlib.Path] = []
        self.stopped_early = False
        self.preempted_by: str | None = None
        # SIGTERM / SIGINT: the handlers are installed by the Trainer for the whole fit.
        self.stop = StopRequest()
        self._claim = DirectoryClaim(checkpoint_dir)

    # ----- Lightning hooks -----

    def on_train_start(self, trainer: Loop, pl_module: TrialCore) -> None:
        module = self._module(pl_module)
        self._hold_directory(module)
        self.stop.begin()
        if self._run_record is not None and module.is_chief:
            self._run_record.started()
        module.begin_training()
        if self._step_zero_validation and module.state.batches_trained == 0:
            self._validate(trainer, module)
        if self._remaining(module) <= 0:
            self._finish(trainer, module)

    def on_train_batch_end(
        self,
        trainer: Loop,
        pl_module: TrialCore,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        module = self._module(pl_module)
        # Every process polls after every batch (the agreement is a collective).
        stop_signal = self.stop.poll()
        reached = self._reached(module)
        if reached:
            self._report_training(module, module.close_training_window())
            state = module.state
            for kind in reached:
                if kind is _Kind.VALIDATE and not state.validation_is_current:
                    self._validate(trainer, module)
                elif kind is _Kind.CHECKPOINT and not state.checkpoint_is_current:
                    self._checkpoint(module)
                elif kind in (_Kind.TRAIN, _Kind.REPORT):
                    logger.debug("Trained %d batches", state.batches_trained)
                if module.context.get_stop_requested() or self.search_stopped:
                    if not state.checkpoint_is_current:
                        self._checkpoint(module)
                    self._settle(module)
                    self.stopped_early = True
                    trainer.should_stop = True
                    return
        if self._remaining(module) <= 0:
            self._finish(trainer, module)
        elif stop_signal:
            self._preempt(trainer, module, stop_signal)

    def on_train_end(self, trainer: Loop, pl_module: TrialCore) -> None:
        self.stop.end()
        self._claim.release()

    def on_exception(self, trainer: Loop, pl_module: TrialCore, exception: BaseException) -> None:
        self.stop.end(wait=False)
        self._claim.release()

    # ----- the checkpoint directory -----

    def _hold_directory(self, module: TrialCore) -> None:
        """The chief holds the checkpoint directory for the fit (removing what interrupted
        saves left, unless another run uses it) and checks a checkpoint fits there; every
        process learns the outcome, so all fail together before training."""
        problem = None
        if module.is_chief:
            try:
                self._claim.acquire()
            except OSError as exc:
                problem = f"checkpoint directory {self._checkpoint_dir}: {exc}"
            else:
                # What every checkpoint holds at least (no callback's state: its hooks are
                # called at a save, as in Determined, not here).
                ctx = module.context
                states = [m.state_dict() for m in ctx.models]
                states += [o.state_dict() for o in ctx.optimizers]
                states.append(capture_rng_state())
                problem = space_shortfall(self._checkpoint_dir, states)
        problem = module.context.distributed.broadcast(problem)
        if problem:
            raise InvalidArgumentError(problem)

    # ----- preemption -----

    def _preempt(self, trainer: Loop, module: TrialCore, signum: int) -> None:
        """Checkpoint (unless this batch's boundaries just did) and end the fit."""
        self.preempted_by = signal.Signals(signum).name
        if module._window:
            self._report_training(module, module.close_training_window())
        if not module.state.checkpoint_is_current:
            self._checkpoint(module)
        self._settle(module)
        self.stopped_early = True
        trainer.should_stop = True

    # ----- boundary arithmetic -----

    @staticmethod
    def _module(pl_module: TrialCore) -> TrialCore:
        assert isinstance(pl_module, TrialCore), "TrialBoundaries drives a TrialCore"
        return pl_module

    def _remaining(self, module: TrialCore) -> int:
        assert isinstance(self._length.value, int)
        done = (
            module.state.batches_trained
            if isinstance(self._length, Batch)
            else module.state.epochs_trained
        )
        return self._length.value - done

    def _reached(self, module: TrialCore) -> list[_Kind]:
        """The boundaries the batch just trained reaches, in Determined's order."""
        batch_idx = module.state.batches_trained - 1
        epoch_idx, in_epoch = divmod(batch_idx, module.epoch_len)
        epoch_end = in_epoch == module.epoch_len - 1
        reached = []
        for kind, unit in self._boundaries:
            if (
                (isinstance(unit, Batch) and unit.should_stop(batch_idx + 1))
                or (isinstance(unit, Epoch) and epoch_end and unit.should_stop(epoch_idx + 1))
                or (kind is _Kind.TRAIN and self._test_mode)
                or (
                    kind is _Kind.VALIDATE
                    and self._search is not None
                    and self._search.at_rung(batch_idx + 1, epoch_idx + 1 if epoch_end else None)
                )
            ):
                reached.append(kind)
        return reached

    # ----- actions -----

    def _finish(self, trainer: Loop, module: TrialCore) -> None:
        if not module.state.validation_is_current:
            self._validate(trainer, module)
        if not module.state.checkpoint_is_current:
            self._checkpoint(module)
        self._settle(module)
        trainer.should_stop = True

    def _report_training(self, module: TrialCore, averages: dict[str, Any]) -> None:
        if self._run_record is not None and module.is_chief:
            state = module.state
            self._run_record.training(state.batches_trained, state.epochs_trained, averages)

    def _validate(self, trainer: Loop, module: TrialCore) -> None:
        trainer.run_validation()
        metrics = module.last_validation_metrics or {}
        if self._run_record is not None and module.is_chief:
            state = module.state
            self._run_record.validation(state.batches_trained, state.epochs_trained, metrics)
        wanted = False
        if module.is_chief and not module.state.checkpoint_is_current:
            wanted = self._policy == "all" or (self._policy == "best" and self._is_best(metrics))
        if module.context.distributed.broadcast(wanted):
            self._checkpoint(module, metrics)
        if self._search is not None:
            state = module.state
            stop = module.is_chief and self._search.validated(
                state.batches_trained, state.epochs_trained, metrics
            )
            self.search_stopped = bool(module.context.distributed.broadcast(stop))

    def _is_best(self, metrics: dict[str, Any]) -> bool:
        assert self._searcher_metric is not None
        if self._searcher_metric not in metrics:
            raise TrialRuntimeError(
                f"checkpoint_policy='best' compares the searcher metric "
                f"{self._searcher_metric!r}, but validation returned {sorted(metrics)}; return "
                "that metric or change searcher.metric."
            )
        value = searcher_value(self._searcher_metric, metrics[self._searcher_metric])
        better = self._best is None or (
            value < self._best if self._smaller_is_better else value > self._best
        )
        if better:
            self._best = value
        return better

    def _checkpoint(self, module: TrialCore, metrics: dict[str, Any] | None = None) -> None:
        """The chief takes the checkpoint (written in the background by the writer, if any);
        every process learns its id, or that a write failed (this one, or the one before,
        which a new save waits for)."""
        storage_id, failure = "", None
        if module.is_chief:
            if metrics is None and module.state.validation_is_current:
                metrics = module.last_validation_metrics
            value = None
            if metrics and self._searcher_metric in metrics:
                value = float(metrics[self._searcher_metric])
            # The checkpoint is recorded once durable (training may have gone on by then).
            progress = (module.state.batches_trained, module.state.epochs_trained)
            try:
                if self._writer is not None:
                    # The save before is recorded first: retention's history includes it.
                    self._writer.wait()
                entries = None
                if self._retention is not None:
                    entries = {RETENTION_KEY: [self._retention.history(), value]}
                _, storage_id = save_checkpoint(
                    module,
                    self._checkpoint_dir,
                    entries,
                    self._writer,
                    on_durable=functools.partial(
                        self._record, metrics=metrics, value=value, progress=progress
                    ),
                )
            except CheckpointWriteError as exc:
                failure = str(exc)
        else:
            module.state.last_ckpt = module.state.batches_trained
        storage_id, failure = module.context.distributed.broadcast((storage_id, failure))
        if failure:
            raise CheckpointWriteError(failure)
        for cb in module.trial_callbacks.values():
            cb.on_checkpoint_upload_end(uuid=storage_id)

    def _settle(self, module: TrialCore) -> None:
        """The fit ends: wait for the checkpoint in flight, so every process learns whether it
        failed (and the directory is held until it is written)."""
        if self._writer is None:
            return
        failure = None
        if module.is_chief:
            try:
                self._writer.wait()
            except CheckpointWriteError as exc:
                failure = str(exc)
        failure = module.context.distributed.broadcast(failure)
        if failure:
            raise CheckpointWriteError(failure)

    def _record(
        self,
        path: pathlib.Path,
        metrics: dict[str, Any] | None,
        value: float | None,
        progress: tuple[int, int],
    ) -> None:
        """A checkpoint is complete: list it, record it in the run's record, and apply
        retention (which may delete older ones only now that a newer one is durable)."""
        self.checkpoints.append(path)
        if self._run_record is not None:
            try:
                self._run_record.checkpoint(path, path.name, *progress, metrics)
            except OSError as exc:  # moving it into checkpoint storage (a full disk there)
                where = pathlib.Path(self._run_record.storage.root)
                raise write_failure(where, exc, directory_bytes(path)) from None
        if self._retention is not None:
            for removed in self._retention.record(path, value):
                if removed in self.checkpoints:  # not one an earlier run of the trial kept
                    self.checkpoints.remove(removed)

    def continue_retention(self, checkpoint: pathlib.Path, payload: dict[str, Any]) -> None:
        """A run continued from `checkpoint` (in this checkpoint directory) applies the
        retention policy to the checkpoints the run that wrote it kept, too."""
        if self._retention is None:
            return
        if checkpoint.resolve().parent != self._checkpoint_dir.resolve():
            return
        recorded = (payload.get(EXTRAS_KEY) or {}).get(RETENTION_KEY)
        if isinstance(recorded, list) and len(recorded) == 2:
            history, value = recorded
            metric = float(value) if isinstance(value, (int, float)) else None
            self._retention.resume(checkpoint.resolve(), history, metric)
