"""`Checkpointer`: a fit's checkpoints, from the directory claim to the last write.

One object owns everything a fit does with its checkpoint directory: it holds the directory
for the fit (`DirectoryClaim`: leftovers of interrupted saves removed unless another live run
uses it; a checkpoint must fit), decides which validations get a checkpoint
(`checkpoint_policy`), saves through the background `CheckpointWriter` (the files, `latest`),
tells the observers once a checkpoint is durable and only then applies retention, and waits
for the write in flight where the fit ends. The loop asks it to save and to wait; the chief
writes. Every process learns each checkpoint's id, or that holding the directory or a write
failed, from the loop's `StopRequest`, so all go on or fail together.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import uuid
from typing import Any

from lightning_bridge._errors import CheckpointWriteError, InvalidArgumentError, TrialRuntimeError
from lightning_bridge._private import dir_mode, make_dir
from lightning_bridge.checkpoint._async import CheckpointWriter
from lightning_bridge.checkpoint._claim import DirectoryClaim
from lightning_bridge.checkpoint._layout import EXTRAS_KEY, partial_dir, seal_checkpoint
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._writable import space_shortfall
from lightning_bridge.translation._observer import FitObserver, Progress, SavedCheckpoint
from lightning_bridge.translation._values import searcher_value
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._payload import (
    capture_rng_state,
    observes_written_checkpoints,
    prepare_save,
    write_prepared,
)

logger = logging.getLogger("lightning_bridge")

CHECKPOINT_POLICIES = ("best", "all", "none")
# The checkpoints kept before a checkpoint (retention), in the payload's bridge entry.
RETENTION_KEY = "retention"


class Checkpointer:
    """Saves a fit's checkpoints into `directory` (see the module docstring)."""

    def __init__(
        self,
        directory: pathlib.Path,
        *,
        policy: str,
        searcher_metric: str | None,
        smaller_is_better: bool,
        retention: CheckpointRetention | None,
        observer: FitObserver,
    ) -> None:
        self.directory = directory
        self._policy = policy
        self._metric = searcher_metric
        self._smaller_is_better = smaller_is_better
        self._best: float | None = None
        self._retention = retention
        self._observer = observer
        self._writer = CheckpointWriter()
        self._claim = DirectoryClaim(directory)
        self._single = True
        # The checkpoints this fit wrote that retention keeps, oldest first.
        self.saved: list[pathlib.Path] = []

    # ----- the directory -----

    def hold(self, core: TrialCore) -> None:
        """The chief holds the checkpoint directory for the fit (removing what interrupted
        saves left, unless another run uses it) and checks a checkpoint fits there; raises
        `InvalidArgumentError` when it cannot (the loop has every process fail with it)."""
        ctx = core.context
        self._single = ctx.distributed.size == 1
        problem = None
        if core.is_chief:
            try:
                self._claim.acquire()
            except OSError as exc:
                problem = f"checkpoint directory {self.directory}: {exc}"
            else:
                # What every checkpoint holds at least (no callback's state: its hooks are
                # called at a save, as in Determined, not here).
                states = [m.state_dict() for m in ctx.models]
                states += [o.state_dict() for o in ctx.optimizers]
                states.append(capture_rng_state())
                problem = space_shortfall(self.directory, states)
        if problem:
            raise InvalidArgumentError(problem)

    def continue_retention(self, checkpoint: pathlib.Path, payload: dict[str, Any]) -> None:
        """A run continued from `checkpoint` (in this checkpoint directory) applies the
        retention policy to the checkpoints the run that wrote it kept, too."""
        if self._retention is None:
            return
        if checkpoint.resolve().parent != self.directory.resolve():
            return
        recorded = (payload.get(EXTRAS_KEY) or {}).get(RETENTION_KEY)
        if isinstance(recorded, list) and len(recorded) == 2:
            history, value = recorded
            metric = float(value) if isinstance(value, (int, float)) else None
            self._retention.resume(checkpoint.resolve(), history, metric)

    # ----- saving -----

    def wants(self, core: TrialCore, metrics: dict[str, Any]) -> bool:
        """Whether the validation that returned `metrics` gets a checkpoint (the policy; the
        chief decides, every process learns it)."""
        wanted = False
        if core.is_chief and not core.state.checkpoint_is_current:
            wanted = self._policy == "all" or (self._policy == "best" and self._is_best(metrics))
        return bool(core.context.distributed.broadcast(wanted))

    def _is_best(self, metrics: dict[str, Any]) -> bool:
        assert self._metric is not None
        if self._metric not in metrics:
            raise TrialRuntimeError(
                f"checkpoint_policy='best' compares the searcher metric {self._metric!r}, but "
                f"validation returned {sorted(metrics)}; return that metric or change "
                "searcher.metric."
            )
        value = searcher_value(self._metric, metrics[self._metric])
        better = self._best is None or (
            value < self._best if self._smaller_is_better else value > self._best
        )
        if better:
            self._best = value
        return better

    def save(self, core: TrialCore, metrics: dict[str, Any] | None = None) -> str:
        """The chief takes a checkpoint (written in the background) and returns its id ("" on
        the other processes); raises `CheckpointWriteError` when a write failed (this one, or
        the one before, which a new save waits for)."""
        if core.sharded_checkpoints:
            return self._save_sharded(core, metrics)
        storage_id = ""
        if core.is_chief:
            if metrics is None and core.state.validation_is_current:
                metrics = core.last_validation_metrics
            value = None
            if metrics and self._metric in metrics:
                value = float(metrics[self._metric])
            # The checkpoint is announced once durable (training may have gone on by then).
            progress = Progress(core.state.batches_trained, core.state.epochs_trained)
            # The save before is finished first: retention's history includes it.
            self._writer.wait()
            entries = None
            if self._retention is not None:
                entries = {RETENTION_KEY: [self._retention.history(), value]}
            prepared = prepare_save(core, entries)
            durable = functools.partial(
                self._durable, metrics=metrics, value=value, progress=progress
            )
            if observes_written_checkpoints(core.trial_callbacks.values()):
                # Those hooks are promised a complete checkpoint: written here and now.
                path, storage_id = write_prepared(core, self.directory, prepared)
                durable(path)
            else:
                _, storage_id = self._writer.submit(
                    self.directory,
                    prepared.payload,
                    prepared.trial_state,
                    prepared.load_data,
                    durable,
                    **prepared.options,
                )
        else:
            core.state.last_ckpt = core.state.batches_trained
        return storage_id

    def _save_sharded(self, core: TrialCore, metrics: dict[str, Any] | None) -> str:
        """A checkpoint every process writes its part of (a collective, written now): the
        chief names it and makes its partial directory, each process writes its part there,
        then the chief seals it (progress, load data, metadata, code, `latest`) and tells the
        observers. Every process fires the trial callbacks' write hooks on the sealed path."""
        dist = core.context.distributed
        chief = core.is_chief
        state = core.state
        state.last_ckpt = state.batches_trained
        if chief and metrics is None and state.validation_is_current:
            metrics = core.last_validation_metrics
        value = None
        if chief and metrics and self._metric in metrics:
            value = float(metrics[self._metric])
        entries: dict[str, Any] = {}
        problem = None
        storage_id = ""
        if chief:
            storage_id = str(uuid.uuid4())
            if self._retention is not None:
                entries = {RETENTION_KEY: [self._retention.history(), value]}
            try:
                make_dir(self.directory)
                partial_dir(self.directory, storage_id).mkdir(mode=dir_mode())
            except OSError as exc:
                problem = f"checkpoint directory {self.directory}: {exc}"
        storage_id, problem = dist.broadcast((storage_id, problem))
        if problem:
            raise CheckpointWriteError(problem)
        tmp = partial_dir(self.directory, storage_id)
        core.write_checkpoint_part(tmp, entries)
        # Every part is written before the chief seals the checkpoint.
        dist.allgather(None)
        path = self.directory / storage_id
        if chief:
            load_data, options = core.checkpoint_seal()
            path = seal_checkpoint(
                self.directory, storage_id, state.to_dict(), load_data, **options
            )
        dist.allgather(None)
        for cb in core.trial_callbacks.values():
            cb.on_checkpoint_end(str(path))
            cb.on_checkpoint_write_end(str(path))
        if chief:
            self._durable(
                path,
                metrics=metrics,
                value=value,
                progress=Progress(state.batches_trained, state.epochs_trained),
            )
        return storage_id if chief else ""

    @property
    def busy(self) -> bool:
        """Whether a save is queued or being written."""
        return self._writer.busy

    def advance(self, training_goes_on: bool) -> None:
        """After a batch with a save in flight: start a queued save with a snapshot if training
        goes on (the end of the fit writes it without one), or finish a write that is done.
        With several processes a finished save is left to the next save or the fit's end,
        where every process learns whether it failed."""
        writer = self._writer
        if writer.queued:
            if training_goes_on:
                writer.start(copy=True)
        elif self._single:
            writer.poll()

    def settle(self, core: TrialCore) -> None:
        """The fit ends: the chief waits for the checkpoint in flight (the directory is held
        until it is written); raises `CheckpointWriteError` when it failed."""
        if core.is_chief:
            self._writer.wait()

    def close(self, failed: bool) -> None:
        """Finish the write in flight (after a failure, report rather than raise its error),
        then let go of the directory."""
        try:
            self._writer.close()
        except Exception:
            if not failed:
                raise
            logger.exception("A checkpoint being written when the fit failed was not completed")
        finally:
            self._claim.release()

    def _durable(
        self,
        path: pathlib.Path,
        metrics: dict[str, Any] | None,
        value: float | None,
        progress: Progress,
    ) -> None:
        """A checkpoint is complete: list it, tell the observers, then apply retention (which
        may delete older ones only now that a newer one is durable)."""
        self.saved.append(path)
        self._observer.on_checkpoint(SavedCheckpoint(path, progress, metrics))
        if self._retention is not None:
            for removed in self._retention.record(path, value):
                if removed in self.saved:  # not one an earlier run of the trial kept
                    self.saved.remove(removed)
