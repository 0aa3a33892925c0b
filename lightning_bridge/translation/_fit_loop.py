"""`FitLoop`: `Trainer.fit`'s loop, on `lightning.Fabric`.

The loop is the trial's own, as in Determined: draw a batch, train it (`TrialCore`), let
`TrialBoundaries` check Determined's schedule, repeat until the schedule stops it. Lightning
does the engine work underneath (`FabricEngine`: strategy, precision plugin, loggers);
`lightning.Trainer`'s per-step machinery (fetchers, progress trackers, hook dispatch on every
batch) is what a trial does not need, and on small models it cost more than the step itself.
Validation runs the trial's validation loader through the same engine, in eval mode without
gradients. Checkpoints are written in the background (`CheckpointWriter`); the loop starts a
queued write with a snapshot when training goes on, and waits for it when the fit ends, is
preempted or fails. Order of events, as under `lightning.Trainer` before: `on_trial_startup`,
data loaders built, `on_training_start` (after any restore), batches, `on_trial_shutdown`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lightning_bridge.checkpoint._async import CheckpointWriter
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.translation._boundaries import TrialBoundaries
from lightning_bridge.translation._core import TrialCore
from lightning_bridge.translation._fabric_engine import FabricEngine
from lightning_bridge.translation._feed import FullDatasetPass
from lightning_bridge.translation._progress import ProgressBar

logger = logging.getLogger("lightning_bridge")


class FitLoop:
    """Trains a `TrialCore` on a `FabricEngine` with Determined's schedule (`boundaries`)."""

    def __init__(
        self,
        core: TrialCore,
        engine: FabricEngine,
        boundaries: TrialBoundaries,
        *,
        writer: CheckpointWriter,
        progress_bar: bool = True,
        profiler: Any = None,
        length: TrainUnit | None = None,
    ) -> None:
        self.core = core
        self.engine = engine
        self.boundaries = boundaries
        self.writer = writer
        self.profiler = profiler
        self._progress_bar = progress_bar
        self._length = length
        self._single = core.context.distributed.size == 1
        # Set by the boundaries (as `lightning.Trainer.should_stop` was): the fit ends after
        # the current batch.
        self.should_stop = False

    # ----- the whole fit -----

    def run(self) -> None:
        core = self.core
        core.startup()
        core.build_data()
        if self._progress_bar and core.is_chief:
            self.engine.progress = ProgressBar(self._total_batches(), core.start_batch)
        try:
            self.boundaries.on_train_start(self, core)
            if self.profiler is None:
                self._train()
            else:
                self._train_profiled(self.profiler)
        except BaseException as exc:
            # The write in flight ends before the boundaries let go of the directory.
            self._finish_writes(failed=True)
            self.boundaries.on_exception(self, core, exc)
            raise
        finally:
            if self.engine.progress is not None:
                self.engine.progress.close(core.state.batches_trained)
                self.engine.progress = None
        try:
            self._finish_writes(failed=False)
        except BaseException as exc:
            self.boundaries.on_exception(self, core, exc)
            raise
        self.boundaries.on_train_end(self, core)

    def _total_batches(self) -> int | None:
        """The fit's length in batches, for the progress bar."""
        length = self._length
        if not isinstance(length, (Batch, Epoch)) or not isinstance(length.value, int):
            return None
        return length.value * (self.core.epoch_len if isinstance(length, Epoch) else 1)

    def _finish_writes(self, failed: bool) -> None:
        """Wait for the checkpoint in flight; after a failure, report (not raise) its error."""
        try:
            self.writer.close()
        except Exception:
            if not failed:
                raise
            logger.exception("A checkpoint being written when the fit failed was not completed")

    # ----- training -----

    def _train(self) -> None:
        core, writer = self.core, self.writer
        iterator = core.train_iterator
        assert iterator is not None
        train_batch = core.train_batch
        run = self.engine.run
        direct = not self.engine.distributed and self.engine._autocast is None
        batch_end = self.boundaries.on_train_batch_end
        progress = self.engine.progress
        while not self.should_stop:
            batch = next(iterator)
            if direct:
                train_batch(batch)
            else:
                run(train_batch, batch)
            done = core.state.batches_trained
            batch_end(self, core, None, batch, done - 1)
            if writer.busy:
                self._after_save()
            if progress is not None and done >= progress.next_at:
                progress.advance(done)

    def _train_profiled(self, profiler: Any) -> None:
        core = self.core
        iterator = core.train_iterator
        assert iterator is not None
        progress = self.engine.progress
        while not self.should_stop:
            with profiler.profile("run_training_batch"):
                batch = next(iterator)
                with profiler.profile("training_step"):
                    self.engine.run(core.train_batch, batch)
            done = core.state.batches_trained
            with profiler.profile("[TrialBoundaries].on_train_batch_end"):
                self.boundaries.on_train_batch_end(self, core, None, batch, done - 1)
            if self.writer.busy:
                self._after_save()
            if progress is not None and done >= progress.next_at:
                progress.advance(done)

    def _after_save(self) -> None:
        """A checkpoint was queued or is being written: start it with a snapshot if training
        goes on (the end of the fit writes it without one), or finish it if it is done. With
        several processes a finished save is left to the next checkpoint or the fit's end,
        where every process learns whether it failed (`TrialBoundaries`)."""
        if self.writer.queued:
            if not self.should_stop:
                self.writer.start(copy=True)
        elif self._single:
            self.writer.poll()

    # ----- validation (TrialBoundaries calls this) -----

    def run_validation(self) -> None:
        """One validation pass over the trial's validation data (every process its shard)."""
        core, engine, profiler = self.core, self.engine, self.profiler
        loader: Any = core.val_loader if core.evaluates_batches else FullDatasetPass()
        limit = 1 if core.test_mode else None
        if profiler is not None:
            profiler.start("run_validation")
        try:
            with engine.evaluating(core.context.models):
                core.start_validation()
                for batch_idx, batch in enumerate(loader):
                    if limit is not None and batch_idx >= limit:
                        break
                    if profiler is None:
                        engine.run(core.validate_batch, batch, batch_idx)
                    else:
                        with profiler.profile("validation_step"):
                            engine.run(core.validate_batch, batch, batch_idx)
                core.end_validation(engine.device)
        finally:
            if profiler is not None:
                profiler.stop("run_validation")


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
