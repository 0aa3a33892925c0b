"""`LightningRun`: a LightningModule (and data module) running as a trial, as one object.

The run owns everything the module's fit needs under a trial: the Trainer arguments
(`_trainer_arguments`), Lightning's precision plugin, the stand-in trainer
(`_stand_in_trainer`), what `self.log` records (`_module_log`), the callbacks and the module's
hooks (`_lightning_callbacks`), the training loader (`_module_data`) and the optimization
(`_optimization`). Its public methods are the trial's moments, called by the trial class
(`_trial`) and its `PyTorchCallback` (`_trial_callback`): a training batch, a validation and
its batches, an epoch's start and end, a checkpoint's save and load, the start and the end of
training. Each runs what `lightning.Trainer.fit` runs at that moment, in its order;
docs/lightning.md lists every hook.
"""

from __future__ import annotations

import types
from typing import Any

from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import extract_batch_size

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_callbacks import (
    Hooks,
    TrainerCallbacks,
    merge,
    model_callbacks,
)
from lightning_bridge.adapter._lightning_packages import package_of
from lightning_bridge.adapter._metric_values import combine_training, combine_validation
from lightning_bridge.adapter._module_data import (
    NoValidation,
    RepeatingLoader,
    Tagged,
    TrainingData,
    hook_owner,
    no_validation_loader,
    validation_loader,
)
from lightning_bridge.adapter._module_log import LogRouter
from lightning_bridge.adapter._optimization import Optimization, step_args
from lightning_bridge.adapter._optimizers import parse_optimizers, step_schedulers
from lightning_bridge.adapter._refusals import has_validation, refusals
from lightning_bridge.adapter._stand_in_trainer import StandInTrainer, distributed
from lightning_bridge.adapter._trainer_arguments import config_of, precision_plugin, read_settings
from lightning_bridge.translation._lightning_private import set_lightning_optimizers

# What waits for the validation that may end a batch or an epoch (Lightning runs it after).
_PLATEAU_STEP = "step_plateau"
_EPOCH_END = "epoch_end"


class LightningRun:
    """The module's fit under a trial (see the module docstring).

    Built in the trial's `__init__`: it checks what a trial cannot run, runs `prepare_data`,
    `setup` and `configure_optimizers`, and wraps the model, optimizers, schedulers and
    reducers with the trial context. `api` is the `determined.pytorch`-like module whose
    classes the trainer checks for (`lightning_bridge` or `determined.pytorch`).
    """

    def __init__(
        self,
        context: Any,
        api: types.ModuleType,
        module: Any,
        datamodule: Any,
        callbacks: list[Any],
        constructor_args: set[str] | None,
    ) -> None:
        self.context = context
        self.api = api
        self.module = module
        self.datamodule = datamodule
        self.settings = read_settings(context, dict(context.get_hparams()), constructor_args)
        context.experimental.disable_dataset_reproducibility_checks()
        context.experimental.disable_auto_to_device()
        device_type = str(getattr(context, "device", "cpu")).split(":")[0]
        self.precision = precision_plugin(package_of(module), self.settings.precision, device_type)
        self.log = LogRouter(lambda: distributed() and context.distributed.size > 1)
        self.data = TrainingData(module, datamodule, context, self.settings)
        self.trainer = StandInTrainer(
            context, module, datamodule, self.settings, self.precision, self.data, self.log
        )
        module.trainer = self.trainer
        if datamodule is not None:
            datamodule.trainer = self.trainer
        router = self.log
        module.log = types.MethodType(
            lambda mod, *args, **kwargs: router.log(mod, *args, **kwargs), module
        )
        # As lightning.Trainer: the model's callbacks join the Trainer's before setup.
        merged = merge(list(callbacks), model_callbacks(module))
        problems = refusals(module, datamodule, merged, self.settings, config_of(context))
        if problems:
            raise InvalidTrialError(problems[0])
        self.callbacks = TrainerCallbacks(merged, module, self.trainer, self.log.add_logged)
        self.hooks = Hooks(module, self.callbacks)
        self.optimization = Optimization(
            context, self.hooks, self.trainer, self.precision, aggregation=self.settings.aggregation
        )
        # As in Lightning, limit_val_batches=0 turns validation off.
        self.has_validation = (
            has_validation(module, datamodule) and self.settings.limit_val_batches != 0
        )
        self._several_loaders = False
        # What waits for a validation (plateau steps, the epoch's end), and the batch's place.
        self._pending: list[str] = []
        self._accumulating = False
        self._in_epoch = 0
        self._setup()
        self.model = context.wrap_model(self.precision.convert_module(module))
        self.optimizers = self._configure_optimizers()
        self._wrap_reducers()
        if self.settings.validation_hparams:
            self.settings.check_validation_period(self.data.epoch_len())

    # ----- construction -----

    def _setup(self) -> None:
        """`prepare_data`, then `setup("fit")` of the data module, callbacks and module."""
        dm, hooks = self.datamodule, self.hooks
        if self.context.distributed.local_rank == 0:
            if dm is not None:
                dm.prepare_data()
            hooks.call("prepare_data")
        if self.context.distributed.size > 1:
            self.context.distributed.allgather(None)  # the others wait for the data
        if dm is not None:
            dm.setup(stage="fit")
        self.callbacks.call("setup", "fit")
        hooks.call("setup", "fit")
        hooks.call("configure_model")
        if hooks.overrides("configure_sharded_model"):
            hooks.call("configure_sharded_model")

    def _configure_optimizers(self) -> list[Any]:
        module, context, trainer = self.module, self.context, self.trainer
        optimizers, configs = parse_optimizers(module, self.hooks.call("configure_optimizers"))
        # With the trial's gradient aggregation the loss is divided as Lightning divides it,
        # so the aggregated gradients are not averaged again.
        average = False if self.settings.aggregation else None
        wrapped = [
            context.wrap_optimizer(opt, average_aggregated_gradients=average) for opt in optimizers
        ]
        manual = self.api.LRScheduler.StepMode.MANUAL_STEP
        for config in configs:
            context.wrap_lr_scheduler(config.scheduler, step_mode=manual)
        trainer.optimizers = list(optimizers)
        trainer.lr_scheduler_configs = configs
        set_lightning_optimizers(trainer.strategy, optimizers, package_of(module))
        return wrapped

    def _wrap_reducers(self) -> None:
        log, context = self.log, self.context
        context.wrap_reducer(
            self._reducer(log.training_state, log.reset_window, combine_training),
            name=None,
            for_training=True,
            for_validation=False,
        )
        if self.has_validation:
            # A validation that logs nothing reported reports the training values instead.
            def state() -> Any:
                return log.validation_state() or log.training_as_validation()
        else:
            state = log.training_as_validation
        context.wrap_reducer(
            self._reducer(state, log.val.reset, combine_validation),
            name=None,
            for_training=False,
            for_validation=True,
        )

    def _reducer(self, state: Any, reset: Any, combine: Any) -> Any:
        """A `MetricReducer` of the trial's API (each trainer checks for its own class)."""

        class _Reducer(self.api.MetricReducer):  # type: ignore[name-defined]
            def reset(self) -> None:
                reset()

            def per_slot_reduce(self) -> Any:
                return state()

            def cross_slot_reduce(self, per_slot_metrics: list) -> Any:
                return combine(per_slot_metrics)

        return _Reducer()

    # ----- training -----

    def training_loader(self) -> RepeatingLoader:
        """The trial's training loader: the module's, repeated epoch after epoch."""
        return self.data.for_trial()

    def start_training(self) -> None:
        """`on_fit_start`, `on_train_start` (after a checkpoint was restored)."""
        self.hooks.run("on_fit_start")
        self.hooks.run("on_train_start")

    def start_epoch(self, epoch_idx: int) -> None:
        """`on_train_epoch_start`, after what waited for a validation that did not come."""
        self.flush()
        self.trainer.current_epoch = epoch_idx
        self.trainer.state.stage = RunningStage.TRAINING
        self.hooks.run("on_train_epoch_start")

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        """One training batch as Lightning's epoch loop runs it (`batch_idx` counts batches
        since the trial began; the module sees the index within the epoch)."""
        self.flush()
        module, trainer, hooks, log = self.module, self.trainer, self.hooks, self.log
        epoch_len = self.data.epoch_len()
        in_epoch = batch_idx % epoch_len if epoch_len else batch_idx
        last = epoch_len is not None and in_epoch == epoch_len - 1
        self._in_epoch = in_epoch
        trainer.current_epoch = epoch_idx
        trainer.state.stage = RunningStage.TRAINING
        batch = self._transfer(batch)
        log.start_batch(log.train, batch)
        self.callbacks.call("on_train_batch_start", batch, in_epoch)
        if hooks.call("on_train_batch_start", batch, in_epoch) == -1:
            raise InvalidTrialError(
                "on_train_batch_start() returned -1 to skip the rest of the epoch; a trial "
                "cannot end an epoch early. Stop training with self.trainer.should_stop = True."
            )
        accumulate = int(trainer.accumulate_grad_batches)
        self._accumulating = bool(
            module.automatic_optimization and (in_epoch + 1) % accumulate != 0 and not last
        )
        outputs, loss = self.optimization.training_step(
            batch, epoch_idx, in_epoch, self._accumulating
        )
        configs, metrics = trainer.lr_scheduler_configs, log.callback_metrics
        if not self._accumulating:
            step_schedulers(module, hooks.call, configs, metrics, "step", False, in_epoch)
        if last:
            step_schedulers(module, hooks.call, configs, metrics, "epoch", False, epoch_idx)
        hooks.run("on_train_batch_end", outputs, batch, in_epoch)
        log.end_batch(log.train)
        log.finish_training_batch(loss)
        if not self._accumulating:
            # ReduceLROnPlateau stepped by batch: after the validation this batch may end in.
            self._pending.append(_PLATEAU_STEP)
        return {}

    def end_epoch(self) -> None:
        """The trainer's epoch end: Lightning validates first when validation falls there, so
        with validation the epoch's end waits for it."""
        if self.has_validation:
            self._pending.append(_EPOCH_END)
            self.log.epoch_pending = True
        else:
            self.flush()
            self._finish_epoch()

    def flush(self) -> None:
        """Run what waited for a validation: plateau steps, then the epoch's end."""
        pending, self._pending = self._pending, []
        for what in pending:
            if what == _PLATEAU_STEP:
                configs, metrics = self.trainer.lr_scheduler_configs, self.log.callback_metrics
                step_schedulers(
                    self.module, self.hooks.call, configs, metrics, "step", True, self._in_epoch
                )
            else:
                self._finish_epoch()

    def _finish_epoch(self) -> None:
        """Lightning's end of a training epoch: hooks, epoch values, plateau schedulers."""
        trainer, log, callbacks = self.trainer, self.log, self.callbacks
        log.epoch_end_reached()
        callbacks.call("on_train_epoch_end", monitoring=False)
        self.hooks.call("on_train_epoch_end")
        callbacks.call("on_train_epoch_end", monitoring=True)
        log.finish_training_epoch()
        step_schedulers(
            self.module,
            self.hooks.call,
            trainer.lr_scheduler_configs,
            log.callback_metrics,
            interval="epoch",
            plateau=True,
            index=trainer.current_epoch,
        )
        trainer.current_epoch += 1

    def _transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """Lightning's input conversion and batch transfer hooks, then the batch is on the
        module's device."""
        module, dm = self.module, self.datamodule
        batch = self.precision.convert_input(batch)
        device = module.device
        for hook, args in (
            ("on_before_batch_transfer", (dataloader_idx,)),
            ("transfer_batch_to_device", (device, dataloader_idx)),
            ("on_after_batch_transfer", (dataloader_idx,)),
        ):
            owner = hook_owner(hook, module, dm)
            if owner is module:
                batch = self.hooks.call(hook, batch, *args)
            else:
                batch = getattr(owner, hook)(batch, *args)
        return batch

    # ----- validation -----

    def validation_loader(self) -> Any:
        """The module's validation loader(s); one `NoValidation` batch for a module Lightning
        would not validate (its trial reports the last training epoch's values instead)."""
        if not self.has_validation:
            return no_validation_loader()
        loader, self._several_loaders = validation_loader(
            self.module, self.datamodule, self.context, self.settings
        )
        return loader

    def start_validation(self) -> None:
        if not self.has_validation:
            return
        self.trainer.state.stage = RunningStage.VALIDATING
        if not self._accumulating:
            self.hooks.call("on_validation_model_zero_grad")
        self.hooks.call("on_validation_model_eval")
        self.hooks.run("on_validation_start")
        self.hooks.run("on_validation_epoch_start")

    def validation_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """One validation batch (from one of several loaders when tagged with its index)."""
        if isinstance(batch, NoValidation):
            return {}
        dataloader_idx: int | None = None
        if isinstance(batch, Tagged):
            batch, dataloader_idx, batch_idx = batch.batch, batch.dataloader_idx, batch.batch_idx
        self.trainer.state.stage = RunningStage.VALIDATING
        batch = self._transfer(batch, dataloader_idx or 0)
        self.log.start_batch(self.log.val, batch, dataloader_idx)
        extra = () if dataloader_idx is None else (dataloader_idx,)
        self.hooks.run("on_validation_batch_start", batch, batch_idx, *extra)
        with self.precision.val_step_context():
            out = self.hooks.call(
                "validation_step",
                *step_args(self.module.validation_step, batch, batch_idx, dataloader_idx),
            )
        self.hooks.run("on_validation_batch_end", out, batch, batch_idx, *extra)
        self.log.end_batch(self.log.val)
        return {}

    @staticmethod
    def batch_length(batch: Any) -> int:
        """Records in a validation batch, as Lightning counts them."""
        if isinstance(batch, NoValidation):
            return 1
        if isinstance(batch, Tagged):
            batch = batch.batch
        return int(extract_batch_size(batch))

    def end_validation_epoch(self) -> None:
        if not self.has_validation:
            return
        self.log.val.dataloader_idx = None
        self.hooks.run("on_validation_epoch_end")
        self.log.finish_validation_epoch()

    def end_validation(self) -> None:
        """End hooks and train mode, then what Lightning runs after a validation: plateau
        schedulers, the epoch's end."""
        if self.has_validation:
            self.hooks.run("on_validation_end")
            self.hooks.call("on_validation_model_train")
        self.trainer.state.stage = RunningStage.TRAINING
        self.flush()

    # ----- checkpoints and the end -----

    def state_dict(self) -> dict[str, Any]:
        """What the trial's checkpoint keeps beyond weights, optimizers and schedulers."""
        self.flush()
        checkpoint: dict[str, Any] = {}
        callbacks = self.callbacks.state_dict()
        self.callbacks.call("on_save_checkpoint", checkpoint)
        self.hooks.call("on_save_checkpoint", checkpoint)
        dm = self.datamodule
        return {
            "module_checkpoint": checkpoint,
            "datamodule": dm.state_dict() if dm is not None else {},
            "callbacks": callbacks,
            "global_step": self.trainer.global_step,
            "current_epoch": self.trainer.current_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.trainer.global_step = int(state_dict.get("global_step", 0))
        self.trainer.current_epoch = int(state_dict.get("current_epoch", 0))
        checkpoint = dict(state_dict.get("module_checkpoint", {}))
        self.hooks.call("on_load_checkpoint", checkpoint)
        if self.datamodule is not None:
            self.datamodule.load_state_dict(state_dict.get("datamodule", {}))
        self.callbacks.load_state_dict(dict(state_dict.get("callbacks", {})))
        self.callbacks.call("on_load_checkpoint", checkpoint)

    def end_training(self) -> None:
        """`on_train_end`, `on_fit_end`, then `teardown("fit")` (data module first)."""
        self.flush()
        self.hooks.run("on_train_end")
        self.hooks.run("on_fit_end")
        if self.datamodule is not None:
            self.datamodule.teardown(stage="fit")
        self.callbacks.call("teardown", "fit")
        self.hooks.call("teardown", "fit")
