"""`TrialModule`: a `PyTorchTrial` as a LightningModule with manual optimization.

The module owns the trial contract inside Lightning's loops: it builds the trial's data loaders,
runs `train_batch` with Determined's batch and epoch indices, routes `context.backward` and
`step_optimizer` through Lightning's strategy and precision plugin, steps the wrapped LR
schedulers, runs `evaluate_batch` / `evaluate_full_dataset` as validation, reduces metrics and
calls the trial's `PyTorchCallback`s. Under `lightning_bridge.Trainer` a `TrialBoundaries`
callback adds Determined's schedule; handed to a plain `lightning.Trainer` it follows
Lightning's schedule.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.checkpoint._layout import EXTRAS_KEY
from lightning_bridge.checkpoint._state import TrialState
from lightning_bridge.contract._callback import PyTorchCallback
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._lr_scheduler import step_count
from lightning_bridge.contract._step import prepare_step
from lightning_bridge.contract._trial import is_overridden, takes_batch_idx
from lightning_bridge.translation._data_position import PassTracker
from lightning_bridge.translation._feed import EpochFeed, FullDatasetPass, build_trial_data
from lightning_bridge.translation._metrics import (
    average_across_processes,
    average_training_metrics,
    check_training_output,
    to_numpy,
)
from lightning_bridge.translation._payload import apply_payload, trial_payload
from lightning_bridge.translation._reporting import report_training, report_validation
from lightning_bridge.translation._validation import ValidationPass

logger = logging.getLogger("lightning_bridge")


class TrialModule(pl.LightningModule):
    """A LightningModule running a `PyTorchTrial` (manual optimization).

    Build it from a trial and the context the trial was built with; `lightning_bridge.Trainer`
    does this for you, or hand it to your own `lightning.Trainer(...)`.
    """

    def __init__(
        self,
        trial: Any,
        context: PyTorchTrialContext,
        *,
        test_mode: bool = False,
        latest_checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
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
        self._evaluate_batch = is_overridden(trial, "evaluate_batch")
        if self._evaluate_batch == is_overridden(trial, "evaluate_full_dataset"):
            raise InvalidTrialError(
                f"{type(trial).__name__} must define exactly one of evaluate_batch() or "
                f"evaluate_full_dataset(); it defines "
                f"{'both' if self._evaluate_batch else 'neither'}. Prefer evaluate_batch(): it "
                "runs on every process."
            )
        self._trial = trial
        self._ctx = context
        self._test_mode = test_mode
        self._latest_checkpoint = latest_checkpoint
        self.trial_models = torch.nn.ModuleList(context.models)
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
        self._eval_takes_idx = self._evaluate_batch and takes_batch_idx(trial.evaluate_batch)
        self.state = TrialState()
        self._start_batch = 0
        self._window: list[dict[str, Any]] = []
        self._val_loader: Any = None
        self._feed: EpochFeed | None = None
        self._validation = ValidationPass()
        self._lightning_optimizers: dict[int, Any] = {}
        # Held in a plain list, not a module attribute: assigning attributes on an nn.Module
        # every optimizer step is measurably slow.
        self._pending_step: list[tuple[Any, Callable | None, int]] = []
        self._tracker: PassTracker | None = None
        self._resume: tuple[dict[str, Any], TrialState | None] | None = None
        self._started = False
        self._shut_down = False
        # Set by TrialBoundaries: Determined's schedule closes the reporting windows.
        self._on_trial_schedule = False
        self.last_validation_metrics: dict[str, Any] | None = None
        self.last_training_metrics: dict[str, Any] | None = None
        context._driver = self

    # ----- properties used by the boundary callback -----

    @property
    def context(self) -> PyTorchTrialContext:
        return self._ctx

    @property
    def trial(self) -> Any:
        return self._trial

    @property
    def epoch_len(self) -> int:
        assert self._ctx._epoch_len is not None, "training data loader not built"
        return self._ctx._epoch_len

    @property
    def is_chief(self) -> bool:
        return self._ctx.distributed.rank == 0

    def _callbacks(self) -> Iterator[Any]:
        return iter(self.trial_callbacks.values())

    # ----- setup and teardown -----

    def configure_optimizers(self) -> Any:
        return list(self._ctx.optimizers)

    def on_fit_start(self) -> None:
        uuid = None
        if self._latest_checkpoint is not None:
            uuid = pathlib.Path(self._latest_checkpoint).name
        for cb in self._callbacks():
            cb.on_trial_startup(self._start_batch, uuid)

    def train_dataloader(self) -> Any:
        if self._feed is None:
            self._build_data()
        return self._feed

    def val_dataloader(self) -> Any:
        if self._feed is None:
            self._build_data()
        if not self._evaluate_batch:
            return FullDatasetPass()
        return self._val_loader

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
        self._start_batch = state.batches_trained if state is not None else 0
        self._ctx._steps_completed = self._start_batch

    def data_state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the data exactly (see `_data_position`)."""
        tracker = self._tracker
        return {"pass_start_rng": tracker.pass_start_rng if tracker is not None else None}

    def _build_data(self) -> None:
        """Build both loaders and the training iterator, in Determined's order."""
        saved = (self._resume[0].get(EXTRAS_KEY) or {}) if self._resume else {}
        data = build_trial_data(
            self._trial,
            self._ctx,
            evaluate_batch=self._evaluate_batch,
            start_batch=self._start_batch,
            saved=saved,
        )
        self._feed, self._val_loader, self._tracker = data.feed, data.val_loader, data.tracker

    def begin_training(self) -> None:
        """Restore a checkpoint if asked and fire `on_training_start`; runs once per fit."""
        if self._started:
            return
        self._started = True
        if self._resume is not None:
            payload, state = self._resume
            logger.info("Restoring trial from checkpoint %s", self._latest_checkpoint)
            apply_payload(self, payload)
            if state is not None:
                if state.epochs_trained < 0:
                    # Determined < 0.21 (workload_sequencer.pkl) counted batches only.
                    state.epochs_trained = state.batches_trained // self.epoch_len
                self.state = state
        for cb in self._callbacks():
            cb.on_training_start()

    def on_train_start(self) -> None:
        self.begin_training()

    def shutdown(self) -> None:
        """Fire `on_trial_shutdown` once, last-registered callback first."""
        if self._shut_down:
            return
        self._shut_down = True
        self._feed = None
        for cb in reversed(list(self._callbacks())):
            cb.on_trial_shutdown()

    def on_fit_end(self) -> None:
        self.shutdown()

    # ----- training -----

    def training_step(self, dataloader_iter: Iterator) -> None:
        batch, _, _ = next(dataloader_iter)
        ctx, state = self._ctx, self.state
        idx = state.batches_trained
        epoch_len = self.epoch_len
        epoch_idx, in_epoch = divmod(idx, epoch_len)
        if not self._window:
            ctx.reset_reducers()
        ctx._current_batch_idx = idx
        if in_epoch == 0:
            for name, cb in self.trial_callbacks.items():
                if self._epoch_start_takes_idx[name]:
                    cb.on_training_epoch_start(epoch_idx)
                else:
                    cb.on_training_epoch_start()
        if ctx.experimental._auto_to_device:
            batch = ctx.to_device(batch)
        ctx._in_train_batch = True
        try:
            out = self._trial.train_batch(batch=batch, epoch_idx=epoch_idx, batch_idx=idx)
        finally:
            ctx._in_train_batch = False
        metrics = check_training_output(out)
        if ctx._should_communicate_and_update():
            for sched in ctx.lr_schedulers:
                for _ in range(
                    step_count(
                        sched._step_mode,
                        sched._frequency,
                        idx,
                        ctx._aggregation_frequency,
                        epoch_len,
                    )
                ):
                    sched.step()
        self._window.append(metrics)
        state.batches_trained += 1
        if in_epoch == epoch_len - 1:
            for cb in self._callbacks():
                cb.on_training_epoch_end(epoch_idx)
            state.epochs_trained += 1

    def gradient_sync(self, enabled: bool) -> Any:
        """Skip the strategy's gradient all-reduce on batches that only accumulate."""
        if enabled or self._trainer is None:
            return contextlib.nullcontext()
        block = getattr(self.trainer.strategy, "block_backward_sync", None)
        return block() if block is not None else contextlib.nullcontext()

    def run_backward(self, loss: torch.Tensor, sync_gradients: bool, **kwargs: Any) -> None:
        """`context.backward`: Lightning's backward (precision plugin, strategy)."""
        with self.gradient_sync(sync_gradients):
            self.manual_backward(loss, **kwargs)

    def run_step(self, optimizer: Any, clip_grads: Callable | None, divisor: int) -> None:
        """Step through Lightning's optimizer wrapper: precision plugin, then strategy."""
        if not self._lightning_optimizers:
            wrapped = self.optimizers()
            for wrapper in wrapped if isinstance(wrapped, list) else [wrapped]:
                self._lightning_optimizers[id(wrapper.optimizer)] = wrapper
        lopt = self._lightning_optimizers.get(id(optimizer))
        if lopt is None:
            raise InvalidTrialError(
                "step_optimizer() got an optimizer Lightning does not manage; step the object "
                "returned by context.wrap_optimizer()."
            )
        self._pending_step.append((optimizer, clip_grads, divisor))
        try:
            lopt.step()
        finally:
            self._pending_step.pop()

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # Gradients are unscaled here (precision plugin), so averaging and clipping see true
        # gradient values.
        if self._pending_step and self._pending_step[-1][0] is optimizer:
            _, clip_grads, divisor = self._pending_step[-1]
            prepare_step(optimizer, clip_grads, divisor)

    def close_training_window(self) -> dict[str, Any]:
        """Average the window's training metrics, log them, fire `on_training_workload_end`."""
        batch_metrics = [to_numpy(m) for m in self._window]
        self._window = []
        ctx, state = self._ctx, self.state
        if ctx.distributed.size > 1:
            batch_metrics = average_across_processes(ctx.distributed, batch_metrics)
        avg = average_training_metrics(batch_metrics)
        avg.update(to_numpy(ctx.reduce_metrics(for_training=True)))
        if self.is_chief and ctx.get_enable_tensorboard_logging() and self._trainer is not None:
            report_training(self, avg, batch_metrics, state.batches_trained)
        avg.setdefault("batches", state.batches_trained)
        avg.setdefault("epochs", state.epochs_trained)
        self.last_training_metrics = avg
        for cb in self._callbacks():
            cb.on_training_workload_end(avg_metrics=avg, batch_metrics=batch_metrics)
        return avg

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Under a plain lightning.Trainer (no TrialBoundaries), report at Lightning's cadence.
        if self._trainer is None or self._on_trial_schedule:
            return
        every = max(int(getattr(self.trainer, "log_every_n_steps", 50) or 50), 1)
        if self.state.batches_trained % every == 0 or (
            self.state.batches_trained % self.epoch_len == 0
        ):
            self.close_training_window()

    # ----- validation -----

    def on_validation_model_zero_grad(self) -> None:
        # Gradients may be mid-accumulation (aggregation_frequency); Determined keeps them.
        pass

    def _sanity_checking(self) -> bool:
        # Lightning's pre-fit sanity check (plain lightning.Trainer only) runs evaluate_batch to
        # catch errors early; it is not a trial validation, so callbacks and state ignore it.
        return self._trainer is not None and bool(self.trainer.sanity_checking)

    def on_validation_start(self) -> None:
        self._ctx.reset_reducers()
        self._validation = ValidationPass()
        if self._sanity_checking():
            return
        for cb in self._callbacks():
            cb.on_validation_start()
        if self._evaluate_batch:
            for cb in self._callbacks():
                cb.on_validation_epoch_start()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self._evaluate_batch:
            if self.is_chief:
                out = self._trial.evaluate_full_dataset(data_loader=self._val_loader)
                self._validation.set_full(out)
            return
        if self._test_mode and batch_idx > 0:
            return
        if self._ctx.experimental._auto_to_device:
            batch = self._ctx.to_device(batch)
        if self._eval_takes_idx:
            out = self._trial.evaluate_batch(batch=batch, batch_idx=batch_idx)
        else:
            out = self._trial.evaluate_batch(batch=batch)
        self._validation.add_batch(out, batch_idx)

    def on_validation_epoch_end(self) -> None:
        ctx = self._ctx
        validation, self._validation = self._validation, ValidationPass()
        if self._sanity_checking():
            ctx.reset_reducers()
            return
        if self._evaluate_batch:
            outputs = validation.batch_outputs()
            for cb in self._callbacks():
                cb.on_validation_epoch_end(outputs)
            metrics = validation.reduce_batches(self._trial.evaluation_reducer(), self.device)
        else:
            metrics = validation.full_metrics(ctx.distributed)
        metrics.update(to_numpy(ctx.reduce_metrics(for_training=False)))
        for cb in self._callbacks():
            cb.on_validation_end(metrics)
        state = self.state
        state.last_val = state.batches_trained
        if self.is_chief:
            if ctx.get_enable_tensorboard_logging() and self._trainer is not None:
                report_validation(self, metrics, state.batches_trained)
            # As Determined: added once the callbacks have seen the metrics (to the same dict),
            # on the chief, unless the trial reports metrics of these names itself.
            metrics.setdefault("batches", state.batches_trained)
            metrics.setdefault("epochs", state.epochs_trained)
        self.last_validation_metrics = metrics

    # ----- Lightning checkpoints carry the trial state too -----

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_bridge"] = trial_payload(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning restores before building the data: remember where the trial was, and
        # restore the rest (RNG last) when training starts, as for a trial checkpoint.
        payload = checkpoint.get("lightning_bridge")
        if payload is not None:
            self.resume_from(payload, TrialState.from_dict(payload.get("trial_state") or {}))
