"""`TrialCore`: the trial contract, whichever Lightning engine runs it.

Both ways of training a trial share this object, so they cannot drift apart:
`lightning_bridge.Trainer` runs it in its own loop on `lightning.Fabric` (`_fit_loop`), and
`TrialModule` runs it inside a user's `lightning.Trainer`. The core builds the trial's data
loaders, runs `train_batch` with Determined's batch and epoch indices, steps the wrapped LR
schedulers, keeps the training-metric window, runs `evaluate_batch` / `evaluate_full_dataset`,
reduces metrics and calls the trial's `PyTorchCallback`s in Determined's order. It owns the
fit's progress (batches and epochs trained, the batch being trained, the last validation); the
trial's context reads it through its read-only `FitView`. Closed training windows and
validations go to the fit's observers (`FitObserver`: the run record, a search, loggers, the
progress bar). What differs between the engines (the backward pass and optimizer step, the
precision plugin's gradient scaler) is the `Engine` it is attached to.
"""

from __future__ import annotations

import inspect
import logging
import pathlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.checkpoint._layout import EXTRAS_KEY, TrialState
from lightning_bridge.contract._callback import PyTorchCallback
from lightning_bridge.contract._context import PyTorchTrialContext, step_lr_schedulers
from lightning_bridge.contract._step import StepDriver
from lightning_bridge.contract._trial import is_overridden, takes_batch_idx
from lightning_bridge.contract._trial_context import attach_fit
from lightning_bridge.translation._metrics import (
    ValidationPass,
    average_across_processes,
    average_training_metrics,
    check_training_output,
    to_numpy,
)
from lightning_bridge.translation._observer import FitObservers, Progress
from lightning_bridge.translation.fit._payload import apply_payload
from lightning_bridge.translation.fit._trial_data import PassTracker, build_trial_data

logger = logging.getLogger("lightning_bridge")


class Engine(StepDriver, Protocol):
    """What the core needs of the engine running it, beyond backward passes and steps."""

    def gradient_scaler(self) -> Any:
        """The precision plugin's gradient scaler, if it has one (it is checkpointed)."""


class TrialCore:
    """A `PyTorchTrial` and its progress, driven batch by batch by an engine."""

    def __init__(
        self,
        trial: Any,
        context: PyTorchTrialContext,
        *,
        test_mode: bool = False,
        latest_checkpoint: str | None = None,
    ) -> None:
        self._check_wrapped(context)
        base = self.trial_base
        self.evaluates_batches = is_overridden(trial, "evaluate_batch", base)
        if self.evaluates_batches == is_overridden(trial, "evaluate_full_dataset", base):
            raise InvalidTrialError(
                f"{type(trial).__name__} must define exactly one of evaluate_batch() or "
                f"evaluate_full_dataset(); it defines "
                f"{'both' if self.evaluates_batches else 'neither'}. Prefer evaluate_batch(): "
                "it runs on every process."
            )
        self._trial = trial
        self._ctx = context
        self.test_mode = test_mode
        self.latest_checkpoint = latest_checkpoint
        callbacks = trial.build_callbacks()
        if not isinstance(callbacks, dict) or not all(
            isinstance(c, PyTorchCallback) or hasattr(c, "on_validation_end")
            for c in callbacks.values()
        ):
            raise InvalidTrialError(
                "build_callbacks() must return a dict of names to PyTorchCallback instances."
            )
        self.trial_callbacks: dict[str, Any] = callbacks
        self._epoch_start_takes_idx = {
            name: bool(inspect.signature(cb.on_training_epoch_start).parameters)
            for name, cb in callbacks.items()
        }
        self._eval_takes_idx = self.evaluates_batches and takes_batch_idx(trial.evaluate_batch)
        self.state = TrialState()
        # What the context reads (`FitView`): where the fit started, the batch being trained.
        self.start_batch = 0
        self.current_batch: int | None = None
        self.in_train_batch = False
        self._window: list[dict[str, Any]] = []
        self._epoch_len = 0
        self.val_loader: Any = None
        self.train_iterator: Iterator | None = None
        self._tracker: PassTracker | None = None
        self._validation = ValidationPass()
        self._resume: tuple[dict[str, Any], TrialState | None] | None = None
        self._started = False
        self._restored = False
        self._shut_down = False
        self._engine: Engine | None = None
        self.last_validation_metrics: dict[str, Any] | None = None
        self.last_training_metrics: dict[str, Any] | None = None
        # Told of closed training windows and validations (on the chief).
        self.observers = FitObservers()
        attach_fit(context, self)

    def _check_wrapped(self, context: Any) -> None:
        """The trial wrapped what its engine trains (a model and an optimizer)."""
        if not context.models:
            raise InvalidTrialError(
                "The trial wrapped no model: call self.model = context.wrap_model(model) in "
                "the trial's __init__."
            )
        if not context.optimizers:
            raise InvalidTrialError(
                "The trial wrapped no optimizer: call self.opt = context.wrap_optimizer(opt) "
                "in the trial's __init__."
            )

    # The name of the trial contract's base class (whose methods count as not overridden).
    trial_base = "PyTorchTrial"

    # Whether every process writes its own part of a checkpoint (a collective save) rather
    # than the chief writing the whole payload (`Checkpointer`).
    sharded_checkpoints = False

    def write_checkpoint_part(self, directory: pathlib.Path, entries: dict[str, Any]) -> None:
        """This process's part of a sharded checkpoint, into `directory` (see
        `sharded_checkpoints`); `entries` are the bridge's own (the chief's retention)."""
        raise NotImplementedError("a PyTorchTrial's checkpoint is written by the chief")

    def checkpoint_seal(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A sharded checkpoint's `load_data.json`, and the code folder to copy into it
        (`seal_checkpoint`'s `code_dir` and `code_exclude`)."""
        raise NotImplementedError("a PyTorchTrial's checkpoint is written by the chief")

    def attach(self, engine: Engine) -> None:
        """Run backward passes and steps through `engine` from now on."""
        self._engine = engine

    # ----- what the engines, the loop and the context read -----

    @property
    def driver(self) -> Engine | None:
        return self._engine

    @property
    def epoch_length(self) -> int | None:
        return self._epoch_len or None

    @property
    def window_open(self) -> bool:
        """Whether batches were trained since the last training report."""
        return bool(self._window)

    @property
    def progress(self) -> Progress:
        return Progress(self.state.batches_trained, self.state.epochs_trained)

    @property
    def context(self) -> PyTorchTrialContext:
        return self._ctx

    @property
    def trial(self) -> Any:
        return self._trial

    @property
    def epoch_len(self) -> int:
        assert self._epoch_len, "training data loader not built"
        return self._epoch_len

    @property
    def is_chief(self) -> bool:
        return self._ctx.distributed.rank == 0

    def gradient_scaler(self) -> Any:
        return self._engine.gradient_scaler() if self._engine is not None else None

    # ----- data, resuming, start and end -----

    def build_data(self) -> None:
        """Build both loaders and the training iterator, in Determined's order (once)."""
        if self.train_iterator is not None:
            return
        saved = (self._resume[0].get(EXTRAS_KEY) or {}) if self._resume else {}
        data = build_trial_data(
            self._trial,
            self._ctx,
            evaluate_batch=self.evaluates_batches,
            start_batch=self.start_batch,
            saved=saved,
            chief=self.is_chief,
            on_epoch_len=self._set_epoch_len,
        )
        self.train_iterator, self.val_loader = data.iterator, data.val_loader
        self._tracker = data.tracker
        self._epoch_len = data.epoch_len

    def _set_epoch_len(self, epoch_len: int) -> None:
        self._epoch_len = epoch_len

    def resume_from(
        self, payload: dict[str, Any], state: TrialState | None, *, warm_start: bool = False
    ) -> None:
        """Continue from a loaded checkpoint: skip the batches it trained, restore at start.

        `warm_start` starts a new run from it instead: its states without its counters, data
        position or pending gradients (see `_resume`)."""
        if warm_start:
            payload = {k: v for k, v in payload.items() if k not in (EXTRAS_KEY, "trial_state")}
            state = None
        self._resume = (payload, state)
        self._restored = False
        self.start_batch = state.batches_trained if state is not None else 0

    def data_state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the data exactly (see `_trial_data`)."""
        tracker = self._tracker
        return {"pass_start_rng": tracker.pass_start_rng if tracker is not None else None}

    def startup(self) -> None:
        """`on_trial_startup` with the batch the fit starts from and the checkpoint's id."""
        uuid = None
        if self.latest_checkpoint is not None:
            uuid = pathlib.Path(self.latest_checkpoint).name
        for cb in self.trial_callbacks.values():
            cb.on_trial_startup(self.start_batch, uuid)

    def begin_training(self) -> None:
        """Restore a checkpoint if asked and fire `on_training_start`; runs once per fit."""
        if self._started:
            return
        self._started = True
        self.restore()
        for cb in self.trial_callbacks.values():
            cb.on_training_start()

    def restore(self) -> None:
        """Apply the checkpoint the run continues from, once: where training starts, or
        before a validation outside a fit (`lightning.Trainer.validate`)."""
        if self._resume is not None and not self._restored:
            self._restored = True
            payload, state = self._resume
            logger.info("Restoring trial from checkpoint %s", self.latest_checkpoint)
            apply_payload(self, payload)
            if state is not None:
                if state.epochs_trained < 0:
                    # Determined < 0.21 (workload_sequencer.pkl) counted batches only.
                    state.epochs_trained = state.batches_trained // self.epoch_len
                self.state = state

    def shutdown(self) -> None:
        """Fire `on_trial_shutdown` once, last-registered callback first."""
        if self._shut_down:
            return
        self._shut_down = True
        self.train_iterator = None
        for cb in reversed(list(self.trial_callbacks.values())):
            cb.on_trial_shutdown()

    # ----- training -----

    def train_batch(self, batch: Any) -> None:
        """Train one batch: epoch-start callbacks, `train_batch`, LR schedulers, epoch end."""
        ctx, state = self._ctx, self.state
        idx = state.batches_trained
        epoch_len = self._epoch_len
        epoch_idx, in_epoch = divmod(idx, epoch_len)
        if not self._window:
            ctx.reset_reducers()
        self.current_batch = idx
        if in_epoch == 0:
            for name, cb in self.trial_callbacks.items():
                if self._epoch_start_takes_idx[name]:
                    cb.on_training_epoch_start(epoch_idx)
                else:
                    cb.on_training_epoch_start()
        if ctx.experimental._auto_to_device:
            batch = ctx.to_device(batch)
        self.in_train_batch = True
        try:
            out = self._trial.train_batch(batch=batch, epoch_idx=epoch_idx, batch_idx=idx)
        finally:
            self.in_train_batch = False
        metrics = check_training_output(out)
        if ctx.lr_schedulers:
            step_lr_schedulers(ctx, idx, epoch_len)
        self._window.append(metrics)
        state.batches_trained = idx + 1
        if in_epoch == epoch_len - 1:
            for cb in self.trial_callbacks.values():
                cb.on_training_epoch_end(epoch_idx)
            state.epochs_trained += 1

    def close_training_window(self) -> dict[str, Any]:
        """Average the window's training metrics, log them, fire `on_training_workload_end`."""
        batch_metrics = [to_numpy(m) for m in self._window]
        self._window = []
        ctx, state = self._ctx, self.state
        if ctx.distributed.size > 1:
            batch_metrics = average_across_processes(ctx.distributed, batch_metrics)
        avg = average_training_metrics(batch_metrics)
        avg.update(to_numpy(ctx.reduce_metrics(for_training=True)))
        if self.is_chief and self.observers:
            self.observers.on_training_report(self.progress, avg, batch_metrics)
        avg.setdefault("batches", state.batches_trained)
        avg.setdefault("epochs", state.epochs_trained)
        self.last_training_metrics = avg
        for cb in self.trial_callbacks.values():
            cb.on_training_workload_end(avg_metrics=avg, batch_metrics=batch_metrics)
        return avg

    # ----- validation -----

    def start_validation(self) -> None:
        """A validation begins: reducers reset, `on_validation_start` (and epoch start)."""
        self._ctx.reset_reducers()
        self._validation = ValidationPass()
        for cb in self.trial_callbacks.values():
            cb.on_validation_start()
        if self.evaluates_batches:
            for cb in self.trial_callbacks.values():
                cb.on_validation_epoch_start()

    def validate_batch(self, batch: Any, batch_idx: int) -> None:
        """One validation step: an `evaluate_batch`, or the chief's `evaluate_full_dataset`."""
        if not self.evaluates_batches:
            if self.is_chief:
                out = self._trial.evaluate_full_dataset(data_loader=self.val_loader)
                self._validation.set_full(out)
            return
        if self.test_mode and batch_idx > 0:
            return
        if self._ctx.experimental._auto_to_device:
            batch = self._ctx.to_device(batch)
        if self._eval_takes_idx:
            out = self._trial.evaluate_batch(batch=batch, batch_idx=batch_idx)
        else:
            out = self._trial.evaluate_batch(batch=batch)
        self._validation.add_batch(out, batch_idx)

    def discard_validation(self) -> None:
        """Forget a pass that was not a trial validation (Lightning's sanity check)."""
        self._validation = ValidationPass()
        self._ctx.reset_reducers()

    def end_validation(self, device: torch.device) -> dict[str, Any]:
        """Reduce the pass's metrics (across processes too), fire the end callbacks, log."""
        ctx = self._ctx
        validation, self._validation = self._validation, ValidationPass()
        if self.evaluates_batches:
            outputs = validation.batch_outputs()
            for cb in self.trial_callbacks.values():
                cb.on_validation_epoch_end(outputs)
            metrics = validation.reduce_batches(self._trial.evaluation_reducer(), device)
        else:
            metrics = validation.full_metrics(ctx.distributed)
        metrics.update(to_numpy(ctx.reduce_metrics(for_training=False)))
        for cb in self.trial_callbacks.values():
            cb.on_validation_end(metrics)
        state = self.state
        state.last_val = state.batches_trained
        if self.is_chief:
            if self.observers:
                self.observers.on_validation(self.progress, metrics)
            # As Determined: added once the callbacks have seen the metrics (to the same dict),
            # on the chief, unless the trial reports metrics of these names itself.
            metrics.setdefault("batches", state.batches_trained)
            metrics.setdefault("epochs", state.epochs_trained)
        self.last_validation_metrics = metrics
        return metrics
