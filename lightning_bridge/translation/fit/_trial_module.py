"""`TrialModule`: a `PyTorchTrial` as a LightningModule with manual optimization.

For training a trial with your own `lightning.Trainer`: the module runs the trial's
`TrialCore` (the contract shared with `lightning_bridge.Trainer`) inside Lightning's loops.
`context.backward` and `step_optimizer` go through Lightning's strategy and precision plugin
(`manual_backward`, `LightningOptimizer.step`), validation runs as Lightning's validation loop,
training metrics are reported where Lightning logs (`log_every_n_steps`) and at every epoch's
end, to the Trainer's loggers and progress bar (the core's observer `LightningReports`), and
Lightning's own checkpoints carry the trial's state. The schedule is Lightning's: the module
trains one batch per `training_step(batch, batch_idx)`, so `val_check_interval`,
`check_val_every_n_epoch`, `limit_*_batches`, `max_epochs`, `max_steps`, `min_steps`,
`max_time` and `ModelCheckpoint` act as on any LightningModule; `lightning_bridge.Trainer`
follows Determined's instead.

Which layer shards the data: the trial's. Its `pytorch.DataLoader`s shard batch by batch as
Determined does (every process its share of each global batch, in Determined's order) and
resume mid-epoch exactly; Lightning's `DistributedSampler` would shard sample by sample and
restart the epoch. So Lightning gets no `torch.utils.data.DataLoader` to re-wrap: the training
data is an `EpochFeed` and the validation data a `LoaderFeed`, plain sized iterables, which
Lightning hands to its loops as they are whatever `use_distributed_sampler` says (its data
connector re-wraps only `DataLoader` instances, in every Lightning 2.x). The context splits
`global_batch_size` over the processes it was built for, so it must be built for the
Trainer's (`init(devices=N, strategy="ddp")` or torchrun; anything else is refused), and
strategies that spawn processes from a pickled module (`ddp_spawn`, `ddp_fork`) are refused:
the caller's trial would stay untrained.

`context.set_stop_requested(True)` is acted on at the trial's next boundary, as in Determined:
after a batch where Lightning logs (a report) or a validation (an epoch's end is no boundary
unless Lightning validates there, as in Determined). Every process learns there
whether any asked, and all set `trainer.should_stop` after the same batch (`stop_requested`
tells a callback). Lightning then ends the fit as for any callback's stop (a last validation
unless it just ran one; not before `min_steps` / `min_epochs`).

`max_steps` counts what it counts for any manual-optimization LightningModule: optimizer
steps (`trainer.global_step`), one per wrapped optimizer stepped. A trial stepping one
optimizer every batch steps once a batch; with `aggregation_frequency=k` once every k batches;
with two optimizers stepped every batch, twice a batch. Under a user's Trainer the trial's
`aggregation_frequency` is Lightning's `accumulate_grad_batches` (the same meaning: gradients
of k batches averaged, one step): the Trainer runs with the trial's value (logging and
`log_every_n_steps` count steps as with a plain module accumulating k batches); a different
`accumulate_grad_batches` is refused. `gradient_clip_val` / `gradient_clip_algorithm` clip
the trial's gradients through Lightning's `clip_gradients` before every optimizer step, after
the trial's own `clip_grads`, on unscaled gradients. Lightning refuses both arguments for
manual optimization before any hook of the fit runs; the module holds them back from that check
(`configure_callbacks`, the last hook before it) and gives them back in `setup`.

`latest_checkpoint` continues a Determined checkpoint as `fit(latest_checkpoint=...)` does, with
Lightning's loop counters loaded as from a `ckpt_path` saved at the same batch;
`DeterminedCheckpoint` writes such checkpoints. What the module cannot run under a Trainer
(`test`, `predict`, some callbacks) is refused before anything runs
(`_trial_module_refusals`). docs/trialmodule.md has the whole list.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.checkpoint._layout import TrialState, resolve_checkpoint
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.contract._context import PyTorchTrialContext, context_setup
from lightning_bridge.contract._step import prepare_step
from lightning_bridge.translation._lightning_private import (
    continue_fit_progress,
    is_multiprocessing_launcher,
    may_log,
    start_method,
    trainer_logs_now,
)
from lightning_bridge.translation._observer import FitObserver, Progress
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._init import checkpoint_dir, setup_of
from lightning_bridge.translation.fit._metric_reports import (
    log_training,
    log_validation,
    training_values,
    validation_values,
)
from lightning_bridge.translation.fit._payload import trial_payload
from lightning_bridge.translation.fit._resume import starts_new_run
from lightning_bridge.translation.fit._trial_data import EpochFeed, FullDatasetPass, LoaderFeed
from lightning_bridge.translation.fit._trial_module_refusals import refusal

# Lightning 2.4 restarts its loops from a checkpoint taken inside a run one batch late (a plain
# LightningModule too: resumed from step 15 of 36 it trains 22 batches and validates at 19, 25,
# 31 and 37 instead of 18, 24, 30 and 36); Lightning 2.5 counts the restart right.
RESTARTS_EXACTLY = tuple(int(p) for p in pl.__version__.split(".")[:2]) >= (2, 5)
INEXACT_RESTART = (
    f"lightning {pl.__version__} restarts its loops from a checkpoint taken inside a run one "
    "batch late, for any LightningModule: the continued run trains one batch more and "
    "validates one batch later than the uninterrupted one. Install lightning>=2.5 for an "
    "exact continuation."
)


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
            # In `training_step` a step value; at the epoch's end (`on_train_epoch_end`,
            # where Lightning takes epoch values only) the epoch's last window.
            step = not module._epoch_ending
            module.log_dict(
                bar, prog_bar=True, logger=False, on_step=step, on_epoch=not step, batch_size=1
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
        # Trainer arguments Lightning refuses for manual optimization, held back from its check.
        self._held_back: dict[str, Any] = {}
        self._stop_requested = False
        self._epoch_ending = False  # in `on_train_epoch_end`
        # Lightning restored its loops from its own checkpoint (`ckpt_path`).
        self._restored_by_lightning = False
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
        # gradient values: the trial's aggregation and `clip_grads` first, then the Trainer's
        # `gradient_clip_val` (Lightning's own clipping, which manual optimization calls).
        if self._pending_step and self._pending_step[-1][0] is optimizer:
            _, clip_grads, divisor = self._pending_step[-1]
            prepare_step(optimizer, clip_grads, divisor)
        if self._trainer is not None and self.trainer.gradient_clip_val:
            self.clip_gradients(optimizer)

    # ----- setup and teardown -----

    def configure_callbacks(self) -> Any:
        """Hold back the Trainer arguments Lightning refuses for manual optimization (its
        check follows this hook); `setup` gives them back. See the module docstring. Refuses,
        before anything runs, what a TrialModule cannot do under this Trainer."""
        trainer = self.trainer
        problem = refusal(trainer, self)
        if problem:
            raise InvalidArgumentError(problem)
        if trainer.gradient_clip_val:
            self._held_back["gradient_clip_val"] = trainer.gradient_clip_val
            trainer.gradient_clip_val = None
        accumulate = trainer.accumulate_grad_batches
        aggregation = context_setup(self.context).aggregation_frequency
        if accumulate not in (1, aggregation):
            raise InvalidArgumentError(
                f"Trainer(accumulate_grad_batches={accumulate}) and the trial's "
                f"aggregation_frequency={aggregation} differ. For a TrialModule they are one "
                "setting (the optimizers step once every N batches, on the gradients of the N "
                "batches averaged): build the context with "
                f"init(aggregation_frequency={accumulate}) (Determined's "
                "optimizations.aggregation_frequency) and give the Trainer the same value or "
                "leave accumulate_grad_batches out."
            )
        trainer.accumulate_grad_batches = 1
        self._held_back["accumulate_grad_batches"] = aggregation
        return []

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        for name, value in self._held_back.items():
            setattr(trainer, name, value)
        self._held_back = {}
        launcher = getattr(trainer.strategy, "launcher", None)
        if launcher is not None and is_multiprocessing_launcher(launcher):
            raise InvalidArgumentError(
                f"A TrialModule cannot train under {type(trainer.strategy).__name__} with start "
                f"method {start_method(launcher)!r} (strategy='ddp_spawn', 'ddp_fork', "
                "'ddp_notebook'): each process would train a pickled copy of the trial, and "
                "the trial in your process would stay untrained. Use strategy='ddp' (every "
                "process runs your script) or launch the script with torchrun."
            )
        processes = context_setup(self.context).processes
        if trainer.world_size != processes:
            raise InvalidArgumentError(
                f"The Trainer runs {trainer.world_size} process(es) but the trial's context "
                f"was built for {processes}: the global batch would be split wrongly. Build the "
                "context with the Trainer's processes before the trial, e.g. "
                f"init(accelerator=..., devices={trainer.num_devices}, "
                f"num_nodes={trainer.num_nodes}, strategy='ddp') (it starts the processes, as "
                "Determined does), or launch the script with torchrun."
            )

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
        if not RESTARTS_EXACTLY:
            warnings.warn(INEXACT_RESTART, stacklevel=2)
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
            # Lightning restoring its loops (from `ckpt_path`, or loaded for `latest_checkpoint`)
            # counts its epoch's trained batches itself.
            counted = self._restored_by_lightning or self._continues is not None
            offset = 0 if counted else core.start_batch % core.epoch_len
            self._feed = EpochFeed(core.train_iterator, core.epoch_len, offset)
        return self._feed

    def val_dataloader(self) -> Any:
        self.core.build_data()
        if not self.core.evaluates_batches:
            return FullDatasetPass()
        return LoaderFeed(self.core.val_loader)

    def on_train_start(self) -> None:
        self.core.begin_training()

    def on_fit_end(self) -> None:
        # A checkpoint continued with nothing left to train still leaves its state here.
        self.core.restore()
        self._feed = None
        self.core.shutdown()

    # ----- training -----

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        # The core moves the batch itself, as Determined does (unless the trial disabled it).
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """Train one trial batch; report where Lightning logs, and stop at that boundary if
        the trial asked to."""
        self.core.train_batch(batch)
        if trainer_logs_now(self.trainer):
            if self.core.window_open:
                self.core.close_training_window()
            self._stop_if_requested()

    def on_train_epoch_end(self) -> None:
        if self._feed is not None:
            self._feed.epoch_ended()
        if self.core.window_open:
            self._epoch_ending = True
            try:
                self.core.close_training_window()
            finally:
                self._epoch_ending = False

    # ----- stop requests -----

    @property
    def stop_requested(self) -> bool:
        """Whether the trial's stop request stopped the Trainer (`trainer.should_stop` set).

        As in Determined, `context.set_stop_requested(True)` is acted on at the trial's next
        boundary: after a batch where Lightning logs (`log_every_n_steps`) or
        a validation. Every process learns at that boundary whether any asked (a collective),
        so all stop after the same batch. True from that boundary on (read it in a callback's
        `on_train_batch_end`, `on_validation_end` or `on_train_epoch_end`)."""
        return self._stop_requested

    def _stop_if_requested(self) -> None:
        trainer = self.trainer
        asks = trainer.strategy.reduce_boolean_decision(
            bool(self.context.get_stop_requested()), all=False
        )
        if asks:
            self._stop_requested = True
            trainer.should_stop = True

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
        elif self.trainer.state.fn == "fit":
            self.core.end_validation(self.device)
            self._stop_if_requested()
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
            self._restored_by_lightning = True
            if not RESTARTS_EXACTLY:
                warnings.warn(INEXACT_RESTART, stacklevel=2)
            self.resume_from(payload, TrialState.from_dict(payload.get("trial_state") or {}))
