"""`TrialModule`: a `PyTorchTrial` as a LightningModule with manual optimization.

For training a trial with your own `lightning.Trainer`: the module runs the trial's
`TrialCore` (the contract shared with `lightning_bridge.Trainer`) inside Lightning's loops.
`context.backward` and `step_optimizer` go through Lightning's strategy and precision plugin
(`manual_backward`, `LightningOptimizer.step`), validation runs as Lightning's validation loop,
training metrics are reported at Lightning's logging interval (a `Schedule` whose reporting
period it is) and every epoch's end, to the Trainer's loggers and progress bar (the core's
observer `LightningReports`), and Lightning's own checkpoints carry the trial's state. The
length, validations and checkpoints are Lightning's (epochs, `val_check_interval`);
`lightning_bridge.Trainer` follows Determined's instead. `latest_checkpoint` continues a
Determined checkpoint as `fit(latest_checkpoint=...)` does, with Lightning's loop counters
loaded as from a `ckpt_path` saved at the same batch; `DeterminedCheckpoint` writes them. What
the module cannot run under a Trainer (`test`, `predict`, some callbacks and precisions) is
refused before anything runs (`_trial_module_refusals`). docs/trialmodule.md has the whole
list.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.checkpoint._layout import TrialState, resolve_checkpoint
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.contract._context import PyTorchTrialContext, context_setup
from lightning_bridge.contract._step import prepare_step
from lightning_bridge.contract._units import Batch
from lightning_bridge.translation._core import TrialCore
from lightning_bridge.translation._init import checkpoint_dir, setup_of
from lightning_bridge.translation._lightning_private import continue_fit_progress, may_log
from lightning_bridge.translation._metric_reports import (
    log_training,
    log_validation,
    training_values,
    validation_values,
)
from lightning_bridge.translation._observer import FitObserver, Progress
from lightning_bridge.translation._payload import trial_payload
from lightning_bridge.translation._resume import starts_new_run
from lightning_bridge.translation._schedule import Boundary, Schedule
from lightning_bridge.translation._trial_data import EpochFeed, FullDatasetPass
from lightning_bridge.translation._trial_module_refusals import refusal


class LightningReports(FitObserver):
    """A `TrialModule`'s reports, to its `lightning.Trainer`'s loggers and progress bar."""

    def __init__(self, module: TrialModule) -> None:
        self._module = module

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        module = self._module
        if module._trainer is None or not module.context.get_enable_tensorboard_logging():
            return
        log_training(module.trainer.loggers, metrics, batch_metrics, progress.batches)
        bar = training_values(metrics)
        # A report closed in a hook where Lightning allows no `self.log` (DeterminedCheckpoint
        # saving in `on_validation_end` or `on_train_end`) reaches the loggers above only.
        if bar and may_log(module):
            module.log_dict(
                bar, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1
            )

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        module = self._module
        if module._trainer is None or not module.context.get_enable_tensorboard_logging():
            return
        bar = validation_values(metrics)
        if module.trainer.state.fn != "fit":
            # `Trainer.validate`: logged the Lightning way, so that it prints and returns them.
            if bar:
                module.log_dict(bar, prog_bar=True, logger=True, batch_size=1)
            return
        log_validation(module.trainer.loggers, metrics, progress.batches)
        if bar:
            module.log_dict(bar, prog_bar=True, logger=False, batch_size=1)


def _read_latest_checkpoint(
    context: PyTorchTrialContext,
    latest_checkpoint: str | os.PathLike[str] | None,
    trusted: bool,
) -> tuple[pathlib.Path, dict[str, Any], TrialState | None] | None:
    """The checkpoint `TrialModule(latest_checkpoint=...)` continues from (a directory, a
    checkpoint id under the checkpoint directory, or "latest"), read safely now, so that a bad
    path fails when the module is built, not when training starts."""
    if latest_checkpoint is None:
        return None
    if not isinstance(trusted, bool):
        raise InvalidArgumentError(f"trust_checkpoint must be True or False; got {trusted!r}.")
    path = resolve_checkpoint(
        latest_checkpoint, checkpoint_dir(context, setup_of(context).checkpoint_dir)
    )
    if not path.is_dir():
        raise InvalidArgumentError(
            f"latest_checkpoint={str(latest_checkpoint)!r} is not a checkpoint directory (nor "
            "a checkpoint id under the checkpoint directory); pass the folder Determined or "
            "lightning_bridge wrote, the one holding state_dict.pth."
        )
    payload, state = read_checkpoint(
        path, trusted=trusted, trust_hint="TrialModule(..., trust_checkpoint=True)"
    )
    return path, payload, state


class TrialModule(pl.LightningModule):
    """A LightningModule running a `PyTorchTrial` (manual optimization).

    Build it from a trial and the context the trial was built with, and hand it to your own
    `lightning.Trainer(...)`.
    """

    def __init__(
        self,
        trial: Any,
        context: PyTorchTrialContext,
        *,
        test_mode: bool = False,
        latest_checkpoint: str | os.PathLike[str] | None = None,
        trust_checkpoint: bool = False,
        warm_start: bool | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        continued = _read_latest_checkpoint(context, latest_checkpoint, trust_checkpoint)
        self.core = TrialCore(
            trial,
            context,
            test_mode=test_mode,
            latest_checkpoint=None if continued is None else str(continued[0]),
        )
        # The run continued from `latest_checkpoint` (its state), for Lightning's counters.
        self._continues: TrialState | None = None
        # The checkpoint continued and its payload (`DeterminedCheckpoint`'s retention).
        self.continued_from: tuple[pathlib.Path, dict[str, Any]] | None = None
        if continued is not None:
            path, payload, state = continued
            warm = starts_new_run(state, context.get_trial_id(), warm_start, path)
            self.core.resume_from(payload, state, warm_start=warm)
            if not warm:
                self._continues = state
                self.continued_from = (path, payload)
        self.trial_models = torch.nn.ModuleList(context.models)
        self._feed: EpochFeed | None = None
        self._lightning_optimizers: dict[int, Any] = {}
        # Held in a plain list, not a module attribute: assigning attributes on an nn.Module
        # every optimizer step is measurably slow.
        self._pending_step: list[tuple[Any, Callable | None, int]] = []
        self._schedule: Schedule | None = None  # built when Lightning's Trainer starts
        self.core.attach(self)
        self.core.observers.add(LightningReports(self))

    # ----- the trial's state, as the payload functions and users read it -----

    @property
    def context(self) -> PyTorchTrialContext:
        return self.core.context

    @property
    def trial(self) -> Any:
        return self.core.trial

    @property
    def state(self) -> TrialState:
        return self.core.state

    @state.setter
    def state(self, value: TrialState) -> None:
        self.core.state = value

    @property
    def trial_callbacks(self) -> dict[str, Any]:
        return self.core.trial_callbacks

    @property
    def epoch_len(self) -> int:
        return self.core.epoch_len

    @property
    def last_validation_metrics(self) -> dict[str, Any] | None:
        return self.core.last_validation_metrics

    @property
    def last_training_metrics(self) -> dict[str, Any] | None:
        return self.core.last_training_metrics

    def data_state(self) -> dict[str, Any]:
        return self.core.data_state()

    def resume_from(
        self, payload: dict[str, Any], state: TrialState | None, *, warm_start: bool = False
    ) -> None:
        """Continue from a loaded checkpoint (see `TrialCore.resume_from`)."""
        self.core.resume_from(payload, state, warm_start=warm_start)

    def close_training_window(self) -> dict[str, Any]:
        return self.core.close_training_window()

    # ----- the engine side of the core (see `_core.Engine`) -----

    def gradient_scaler(self) -> Any:
        plugin = getattr(self._trainer, "precision_plugin", None)
        return getattr(plugin, "scaler", None)

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

    # ----- setup and teardown -----

    def configure_callbacks(self) -> list[pl.Callback]:
        """Refuse, before anything runs, what a TrialModule cannot do under this Trainer."""
        problem = refusal(self.trainer, self)
        if problem:
            raise InvalidArgumentError(problem)
        return []

    def configure_optimizers(self) -> Any:
        return list(self.core.context.optimizers)

    def on_fit_start(self) -> None:
        self.core.startup()
        if self._continues is not None:
            self._continue_lightning_counters(self._continues)

    def _continue_lightning_counters(self, state: TrialState) -> None:
        """A run continued from `latest_checkpoint`: Lightning's counters start where the
        checkpoint's run stopped, as after `Trainer.fit(ckpt_path=...)`, so `max_steps` and
        `max_epochs` count from the run's start as `fit(max_length=...)` does in Determined."""
        if self.trainer.ckpt_path is not None:
            raise InvalidArgumentError(
                "TrialModule(latest_checkpoint=...) and Trainer.fit(ckpt_path=...) both name a "
                "checkpoint to continue from; pass only one."
            )
        if state.batches_trained <= 0:
            return
        self.core.build_data()  # the epoch length
        frequency = context_setup(self.context).aggregation_frequency
        continue_fit_progress(
            self.trainer,
            batches=state.batches_trained,
            epochs=state.batches_trained // self.core.epoch_len,
            epoch_len=self.core.epoch_len,
            steps=state.batches_trained // frequency * len(self.context.optimizers),
        )

    def train_dataloader(self) -> Any:
        if self._feed is None:
            core = self.core
            core.build_data()
            assert core.train_iterator is not None
            offset = core.start_batch % core.epoch_len
            self._feed = EpochFeed(core.train_iterator, core.epoch_len, offset)
        return self._feed

    def val_dataloader(self) -> Any:
        self.core.build_data()
        if not self.core.evaluates_batches:
            return FullDatasetPass()
        return self.core.val_loader

    def on_train_start(self) -> None:
        every = max(int(getattr(self.trainer, "log_every_n_steps", 50) or 50), 1)
        self._schedule = Schedule.for_fit(
            max_length=Batch(sys.maxsize),
            validation_period=None,
            checkpoint_period=None,
            reporting_period=Batch(every),
        )
        self.core.begin_training()

    def on_fit_end(self) -> None:
        # A checkpoint continued with nothing left to train still leaves its state here.
        self.core.restore()
        self._feed = None
        self.core.shutdown()

    # ----- training -----

    def training_step(self, dataloader_iter: Iterator) -> None:
        batch, _, _ = next(dataloader_iter)
        self.core.train_batch(batch)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Report at Lightning's logging interval and at every trial epoch's end.
        if self._trainer is None or self._schedule is None:
            return
        core = self.core
        done, epoch_len = core.state.batches_trained, core.epoch_len
        if not core.window_open:  # a checkpoint (DeterminedCheckpoint) closed it already
            return
        if done % epoch_len == 0 or Boundary.REPORT in self._schedule.reached(done, epoch_len):
            core.close_training_window()

    # ----- validation -----

    def on_validation_model_zero_grad(self) -> None:
        # Gradients may be mid-accumulation (aggregation_frequency); Determined keeps them.
        pass

    def _sanity_checking(self) -> bool:
        # Lightning's pre-fit sanity check runs evaluate_batch to catch errors early; it is not
        # a trial validation, so callbacks and state ignore it.
        return self._trainer is not None and bool(self.trainer.sanity_checking)

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "validate":
            self.core.restore()  # `Trainer.validate` of a module given a latest_checkpoint
        if self._sanity_checking():
            self.core.discard_validation()
        else:
            self.core.start_validation()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.core.validate_batch(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        if self._sanity_checking():
            self.core.discard_validation()
        else:
            self.core.end_validation(self.device)

    # ----- Lightning checkpoints carry the trial state too -----

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lightning_bridge"] = trial_payload(self.core)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning restores before building the data: remember where the trial was, and
        # restore the rest (RNG last) when training starts, as for a trial checkpoint.
        payload = checkpoint.get("lightning_bridge")
        if payload is not None:
            self.resume_from(payload, TrialState.from_dict(payload.get("trial_state") or {}))
