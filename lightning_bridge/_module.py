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

from ._callback import PyTorchCallback
from ._context import PyTorchTrialContext, prepare_step
from ._data import dataset_repro_message, is_trial_data_loader
from ._data_position import PassTracker, tracked_loader
from ._errors import InvalidTrialError
from ._lr_scheduler import step_count
from ._metrics import (
    average_across_processes,
    average_training_metrics,
    check_training_output,
    check_validation_output,
    reduce_validation_metrics,
    to_numpy,
)
from ._reducer import reducers_for_keys
from ._reporting import report_training, report_validation
from ._state import TrialState
from ._trial import is_overridden, takes_batch_idx

logger = logging.getLogger("lightning_bridge")


class _EpochFeed:
    """The training data as Lightning sees it: each iteration yields one trial epoch.

    All epochs draw from one iterator over the repeated (and sharded, skipped) training loader,
    created once like Determined does, so data order and RNG use match an uninterrupted run.
    """

    def __init__(self, iterator: Iterator, epoch_len: int, first_offset: int = 0) -> None:
        self._iterator = iterator
        self._epoch_len = epoch_len
        # A run continued mid-epoch first finishes that epoch.
        self._offset = first_offset

    def __len__(self) -> int:
        return self._epoch_len - self._offset

    def __iter__(self) -> Iterator:
        count, self._offset = self._epoch_len - self._offset, 0
        for _ in range(count):
            try:
                yield next(self._iterator)
            except StopIteration:
                return


class _FullDataset:
    """Validation "loader" of one placeholder batch: `evaluate_full_dataset` runs once, as a
    single validation step, and receives the real validation loader itself."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[None]:
        yield None


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
        self._feed: _EpochFeed | None = None
        self._val_outputs: list[dict[str, Any]] = []
        self._val_keys: set[str] | None = None
        self._full_metrics: dict[str, Any] = {}
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
        context._module = self

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
            return _FullDataset()
        return self._val_loader

    def resume_from(self, payload: dict[str, Any], state: TrialState | None) -> None:
        """Continue from a loaded checkpoint: skip the batches it trained, restore at start."""
        self._resume = (payload, state)
        self._start_batch = state.batches_trained if state is not None else 0
        self._ctx._steps_completed = self._start_batch

    def data_state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the data exactly (see `_data_position`)."""
        tracker = self._tracker
        return {"pass_start_rng": tracker.pass_start_rng if tracker is not None else None}

    def _loader(self, built: Any, fn_name: str, *, repeat: bool, shard: bool, skip: int) -> Any:
        dist = self._ctx.distributed
        if is_trial_data_loader(built):
            if repeat:
                built, self._tracker = tracked_loader(built, {})
            return built.get_data_loader(
                repeat=repeat,
                skip=skip,
                num_replicas=dist.size if shard else 1,
                rank=dist.rank if shard else 0,
            )
        if not self._ctx.experimental._data_repro_checks_disabled:
            raise InvalidTrialError(dataset_repro_message(fn_name, built))
        return built

    def _build_data(self) -> None:
        """Build both loaders and the training iterator, in Determined's order."""
        train = self._loader(
            self._trial.build_training_data_loader(),
            "build_training_data_loader",
            repeat=True,
            shard=True,
            skip=self._start_batch,
        )
        try:
            epoch_len = len(train)
        except TypeError:
            epoch_len = 2**62
        if epoch_len == 0:
            raise InvalidTrialError(
                "The training data loader yields no batches: check the dataset size and "
                "batch_size (with drop_last=True a dataset smaller than one batch is empty)."
            )
        self._ctx._epoch_len = self._ctx.distributed.broadcast(epoch_len)
        if self._tracker is not None and self._start_batch:
            done, in_epoch = divmod(self._start_batch, self.epoch_len)
            saved = (self._resume[0].get("lightning_bridge") or {}) if self._resume else {}
            self._tracker._resume_passes = done
            self._tracker._resume_rng = saved.get("pass_start_rng") if in_epoch else None
        validation = self._trial.build_validation_data_loader()
        if self._evaluate_batch:
            self._val_loader = self._loader(
                validation, "build_validation_data_loader", repeat=False, shard=True, skip=0
            )
            try:
                empty = len(self._val_loader) == 0
            except TypeError:
                empty = False
            if empty:
                raise InvalidTrialError(
                    "The validation data loader yields no batches: give "
                    "build_validation_data_loader() a non-empty dataset."
                )
        elif self.is_chief:
            self._val_loader = self._loader(
                validation, "build_validation_data_loader", repeat=False, shard=False, skip=0
            )
        self._feed = _EpochFeed(iter(train), self.epoch_len, self._start_batch % self.epoch_len)

    def begin_training(self) -> None:
        """Restore a checkpoint if asked and fire `on_training_start`; runs once per fit."""
        if self._started:
            return
        self._started = True
        if self._resume is not None:
            from ._checkpoint import apply_payload

            payload, state = self._resume
            logger.info("Restoring trial from checkpoint %s", self._latest_checkpoint)
            apply_payload(self, payload)
            if state is not None:
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

    def _step_optimizer(self, optimizer: Any, clip_grads: Callable | None, divisor: int) -> None:
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
        self._val_outputs = []
        self._val_keys = None
        self._full_metrics = {}
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
                self._full_metrics = to_numpy(
                    check_validation_output(out, "evaluate_full_dataset()")
                )
            return
        if self._test_mode and batch_idx > 0:
            return
        if self._ctx.experimental._auto_to_device:
            batch = self._ctx.to_device(batch)
        if self._eval_takes_idx:
            out = self._trial.evaluate_batch(batch=batch, batch_idx=batch_idx)
        else:
            out = self._trial.evaluate_batch(batch=batch)
        metrics = check_validation_output(out, "evaluate_batch()")
        if self._val_keys is None:
            self._val_keys = set(metrics)
        elif set(metrics) != self._val_keys:
            raise InvalidTrialError(
                "evaluate_batch() must return the same metric names for every batch: batch "
                f"{batch_idx} returned {sorted(metrics)}, earlier batches "
                f"{sorted(self._val_keys)}."
            )
        self._val_outputs.append(to_numpy(metrics))

    def on_validation_epoch_end(self) -> None:
        ctx = self._ctx
        if self._sanity_checking():
            self._val_outputs = []
            ctx.reset_reducers()
            return
        if self._evaluate_batch:
            if not self._val_outputs:
                raise InvalidTrialError(
                    "The validation data loader yielded no batches: give "
                    "build_validation_data_loader() a non-empty dataset."
                )
            for cb in self._callbacks():
                cb.on_validation_epoch_end(self._val_outputs)
            keys = list(self._val_outputs[0])
            metrics = reduce_validation_metrics(
                self._val_outputs,
                keys,
                reducers_for_keys(self._trial.evaluation_reducer(), keys),
                self.device,
            )
        else:
            metrics = dict(self._full_metrics)
            if ctx.distributed.size > 1:
                metrics = ctx.distributed.broadcast(metrics)
        metrics.update(to_numpy(ctx.reduce_metrics(for_training=False)))
        for cb in self._callbacks():
            cb.on_validation_end(metrics)
        self.state.last_val = self.state.batches_trained
        self.last_validation_metrics = metrics
        if self.is_chief and ctx.get_enable_tensorboard_logging() and self._trainer is not None:
            report_validation(self, metrics, self.state.batches_trained)
        self._val_outputs = []

    # ----- Lightning checkpoints carry the trial state too -----

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from ._checkpoint import trial_payload

        checkpoint["lightning_bridge"] = trial_payload(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning restores before building the data: remember where the trial was, and
        # restore the rest (RNG last) when training starts, as for a trial checkpoint.
        payload = checkpoint.get("lightning_bridge")
        if payload is not None:
            self.resume_from(payload, TrialState.from_dict(payload.get("trial_state") or {}))
