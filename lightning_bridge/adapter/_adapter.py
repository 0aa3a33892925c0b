"""`LightningAdapter` / `lightning_trial`: a LightningModule (and data module) as a trial.

The adapter is a `PyTorchTrial` that uses only the trial contract (`wrap_model`,
`wrap_optimizer`, `wrap_lr_scheduler`, `wrap_reducer`, `backward`, `step_optimizer`, callbacks),
so the same class trains on `lightning_bridge.Trainer` and, built on
`determined.pytorch.PyTorchTrial`, on Determined's own `Trainer`. The module gets a stand-in
trainer (`_trainer`) answering the Trainer settings of `_settings`; `self.log` goes to the
trial's metrics (`_logging`); `configure_optimizers` is parsed by Lightning's helpers
(`_optim`); training and validation batches run as Lightning runs them (`_steps`,
`_validation`); Lightning callbacks run at Lightning's moments (`_trainer_callbacks`); the
trainer meets the module through `_callback`. Modules of the `lightning.pytorch` and the
`pytorch_lightning` packages are both accepted (`_packages`). docs/lightning.md lists every
hook and what happens to it.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

from lightning.pytorch.core.optimizer import LightningOptimizer

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._callback import adapter_callback, adapter_reducer
from lightning_bridge.adapter._data import (
    RepeatingLoader,
    build_from_hparams,
    constructor_arguments,
    distributed_loader,
    hook_owner,
    loaders_of,
)
from lightning_bridge.adapter._hooks import has_validation, refusals
from lightning_bridge.adapter._logging import LogRouter
from lightning_bridge.adapter._metric_values import combine_training, combine_validation
from lightning_bridge.adapter._optim import parse_optimizers, step_schedulers
from lightning_bridge.adapter._packages import is_a, overrides, package_of, submodule
from lightning_bridge.adapter._settings import config_of, precision_plugin, read_settings
from lightning_bridge.adapter._steps import TrainingSteps
from lightning_bridge.adapter._trainer import StandInTrainer, _distributed
from lightning_bridge.adapter._trainer_callbacks import TrainerCallbacks, merge, model_callbacks
from lightning_bridge.adapter._validation import ValidationSteps
from lightning_bridge.contract._trial import is_determined_trial_base


def _api_of(cls: type) -> Any:
    """The `determined.pytorch`-like module whose `PyTorchTrial` the class is built on."""
    if any(is_determined_trial_base(klass) for klass in cls.__mro__):
        return importlib.import_module("determined.pytorch")
    return importlib.import_module("lightning_bridge")


class AdapterMixin(TrainingSteps, ValidationSteps):
    """The trial logic of `LightningAdapter`, independent of the `PyTorchTrial` base."""

    _lb_module_class: type | None = None
    _lb_datamodule_class: type | None = None
    _lb_callbacks: list[Any] | None = None

    def __init__(
        self,
        context: Any,
        lightning_module: Any = None,
        datamodule: Any = None,
        callbacks: list[Any] | None = None,
    ) -> None:
        self.context = context
        hparams = dict(context.get_hparams())
        constructor_args: set[str] | None = None
        if lightning_module is None:
            if self._lb_module_class is None:
                raise InvalidTrialError(
                    "LightningAdapter needs a LightningModule: call "
                    "super().__init__(context, MyModule(...)) or use lightning_trial(MyModule)."
                )
            lightning_module = build_from_hparams(
                self._lb_module_class, hparams, context, "LightningModule"
            )
            constructor_args = set(constructor_arguments(self._lb_module_class))
        if datamodule is None and self._lb_datamodule_class is not None:
            datamodule = build_from_hparams(
                self._lb_datamodule_class, hparams, context, "LightningDataModule"
            )
            if constructor_args is not None:
                constructor_args |= set(constructor_arguments(self._lb_datamodule_class))
        if callbacks is None and self._lb_callbacks is not None:
            callbacks = copy.deepcopy(self._lb_callbacks)  # each trial gets its own state
        if not is_a(lightning_module, "LightningModule"):
            raise InvalidTrialError(
                "LightningAdapter takes a LightningModule (of lightning.pytorch or "
                f"pytorch_lightning); got {type(lightning_module).__name__}."
            )
        if datamodule is not None and not is_a(datamodule, "LightningDataModule"):
            raise InvalidTrialError(
                "datamodule must be a LightningDataModule (of lightning.pytorch or "
                f"pytorch_lightning); got {type(datamodule).__name__}."
            )
        self.lightning_module = lightning_module
        self.datamodule = datamodule
        self._settings = read_settings(context, hparams, constructor_args)
        self._api = _api_of(type(self))
        context.experimental.disable_dataset_reproducibility_checks()
        context.experimental.disable_auto_to_device()
        package = package_of(lightning_module)
        device_type = str(getattr(context, "device", "cpu")).split(":")[0]
        self._precision = precision_plugin(package, self._settings.precision, device_type)
        self._trainer = StandInTrainer(self, self._settings, self._precision)
        self._log = LogRouter(lambda: _distributed() and self.context.distributed.size > 1)
        self._epoch_len: int | None = None
        self._train_loader: Any = None
        self._pending: list[str] = []
        self._accumulating = False
        self._in_epoch = 0
        lightning_module.trainer = self._trainer
        if datamodule is not None:
            datamodule.trainer = self._trainer
        self._route_log()
        # As lightning.Trainer: the model's callbacks join the Trainer's before setup.
        merged = merge(list(callbacks or []), model_callbacks(lightning_module, self._call))
        problems = refusals(
            lightning_module, datamodule, merged, self._settings, config_of(context)
        )
        if problems:
            raise InvalidTrialError(problems[0])
        self._callbacks = TrainerCallbacks(
            merged, lightning_module, self._trainer, self._log.add_logged
        )
        self._has_validation = has_validation(lightning_module, datamodule)
        self._setup()
        self.model = context.wrap_model(self._precision.convert_module(lightning_module))
        self._configure_optimizers(package)
        self._train_reducer = context.wrap_reducer(
            adapter_reducer(
                self._api, self._log.training_state, self._log.reset_window, combine_training
            ),
            name=None,
            for_training=True,
            for_validation=False,
        )
        state = self._log.validation_state if self._has_validation else None
        self._val_reducer = context.wrap_reducer(
            adapter_reducer(
                self._api,
                state or self._log.training_as_validation,
                self._log.val.reset,
                combine_validation,
            ),
            name=None,
            for_training=False,
            for_validation=True,
        )

    # ----- construction -----

    def _route_log(self) -> None:
        import types

        router, module = self._log, self.lightning_module
        module.log = types.MethodType(
            lambda mod, *args, **kwargs: router.log(mod, *args, **kwargs), module
        )

    def _setup(self) -> None:
        """`prepare_data`, then `setup("fit")` of the data module, callbacks and module."""
        module, dm = self.lightning_module, self.datamodule
        if self.context.distributed.local_rank == 0:
            if dm is not None:
                dm.prepare_data()
            self._call("prepare_data")
        if self.context.distributed.size > 1:
            self.context.distributed.allgather(None)  # the others wait for the data
        if dm is not None:
            dm.setup(stage="fit")
        self._callbacks.call("setup", "fit")
        self._call("setup", "fit")
        self._call("configure_model")
        if overrides(module, "configure_sharded_model", "LightningModule"):
            self._call("configure_sharded_model")

    def _configure_optimizers(self, package: Any) -> None:
        module, context, trainer = self.lightning_module, self.context, self._trainer
        optimizers, configs = parse_optimizers(module, self._call("configure_optimizers"))
        # With the trial's gradient aggregation the loss is divided as Lightning divides it,
        # so the aggregated gradients are not averaged again.
        average = False if self._settings.aggregation else None
        self.optimizers = [
            context.wrap_optimizer(opt, average_aggregated_gradients=average) for opt in optimizers
        ]
        manual = self._api.LRScheduler.StepMode.MANUAL_STEP
        for config in configs:
            context.wrap_lr_scheduler(config.scheduler, step_mode=manual)
        trainer.optimizers = list(optimizers)
        trainer.lr_scheduler_configs = configs
        wrapper = (
            LightningOptimizer
            if package.__name__ == "lightning.pytorch"
            else submodule(package, "core.optimizer").LightningOptimizer
        )
        trainer.strategy._lightning_optimizers = [
            wrapper._to_lightning_optimizer(opt, trainer.strategy) for opt in optimizers
        ]

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Run a module hook with its name as `_current_fx_name` (what `self.log` checks)."""
        module = self.lightning_module
        previous = module._current_fx_name
        module._current_fx_name = hook
        try:
            return getattr(module, hook)(*args, **kwargs)
        finally:
            module._current_fx_name = previous

    def _hook(self, hook: str, *args: Any) -> Any:
        """The Lightning callbacks' `hook`, then the module's (Lightning's order)."""
        self._callbacks.call(hook, *args)
        return self._call(hook, *args)

    def _overrides(self, hook: str) -> bool:
        return overrides(self.lightning_module, hook, "LightningModule")

    # ----- training data -----

    def _training_loader(self) -> Any:
        """The module's (or data module's) training loader, built once."""
        if self._train_loader is None:
            module, dm = self.lightning_module, self.datamodule
            if not (
                overrides(module, "train_dataloader", "LightningModule")
                or overrides(dm, "train_dataloader", "LightningDataModule")
            ):
                raise InvalidTrialError(
                    f"{type(module).__name__} has no train_dataloader(): define it on the "
                    "module or pass a LightningDataModule that defines it."
                )
            owner = hook_owner("train_dataloader", module, dm)
            returned = (
                self._call("train_dataloader") if owner is module else owner.train_dataloader()
            )
            (loader,) = loaders_of(returned, "train_dataloader", several=False)
            dist = self.context.distributed
            self._train_loader = distributed_loader(loader, dist.rank, dist.size, shuffle=True)
            try:
                self._epoch_len = len(self._train_loader)
            except TypeError:
                self._epoch_len = None
            self._check_aggregation()
        return self._train_loader

    def _training_epoch_len(self) -> int | None:
        self._training_loader()
        return self._epoch_len

    def _check_aggregation(self) -> None:
        k = self._settings.accumulate_grad_batches
        if self._settings.aggregation and self._epoch_len and self._epoch_len % k:
            raise InvalidTrialError(
                f"optimizations.aggregation_frequency is {k} but an epoch has {self._epoch_len} "
                "batches: Lightning steps the optimizer on each epoch's last batch, the trial's "
                f"aggregation every {k} batches. Choose an aggregation_frequency that divides "
                "the epoch, or remove it and set hparams['accumulate_grad_batches'] (the "
                "adapter then accumulates as Lightning does)."
            )

    def build_training_data_loader(self) -> Any:
        return RepeatingLoader(self._training_loader(), self.context.get_initial_batch)

    # ----- the moments after a batch (called by the callback and the batch methods) -----

    def _flush(self) -> None:
        """Run what waited for a validation: plateau steps, then the epoch's end."""
        pending, self._pending = self._pending, []
        for what in pending:
            if what == "step_plateau":
                self._step_plateau()
            else:
                self._end_epoch()

    def _end_epoch(self) -> None:
        """Lightning's end of a training epoch: hooks, epoch values, plateau schedulers."""
        trainer, log = self._trainer, self._log
        log.epoch_end_reached()
        self._callbacks.call("on_train_epoch_end", monitoring=False)
        self._call("on_train_epoch_end")
        self._callbacks.call("on_train_epoch_end", monitoring=True)
        log.finish_training_epoch()
        step_schedulers(
            self.lightning_module,
            self._call,
            trainer.lr_scheduler_configs,
            log.callback_metrics,
            interval="epoch",
            plateau=True,
            index=trainer.current_epoch,
        )
        trainer.current_epoch += 1

    def build_callbacks(self) -> dict[str, Any]:
        return {"lightning_adapter": adapter_callback(self._api, self)}
