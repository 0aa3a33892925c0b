"""`LightningAdapter` / `lightning_trial`: a LightningModule (and data module) as a trial.

The adapter is a `PyTorchTrial` that uses only the trial contract (`wrap_model`,
`wrap_optimizer`, `wrap_lr_scheduler`, `wrap_reducer`, `backward`, `step_optimizer`, callbacks),
so the same class trains on `lightning_bridge.Trainer` and, built on
`determined.pytorch.PyTorchTrial`, on Determined's own `Trainer`. The module gets a stand-in
trainer (`_adapter_trainer`); `self.log` goes to the trial's metrics (`_adapter_logging`);
`configure_optimizers` is parsed by Lightning's helpers (`_adapter_optim`); the trainer meets the
module through `_adapter_callback`. docs/lightning.md
lists every hook and what happens to it.
"""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._callback import adapter_callback, adapter_reducer
from lightning_bridge.adapter._data import (
    RepeatingLoader,
    build_from_hparams,
    distributed_loader,
    hook_owner,
    single_loader,
)
from lightning_bridge.adapter._logging import LogRouter, combine_training, combine_validation
from lightning_bridge.adapter._optim import parse_optimizers, step_schedulers
from lightning_bridge.adapter._trainer import StandInTrainer, _distributed
from lightning_bridge.contract._trial import is_determined_trial_base

_CLIP_HPARAMS = ("gradient_clip_val", "gradient_clip_algorithm")


def _api_of(cls: type) -> Any:
    """The `determined.pytorch`-like module whose `PyTorchTrial` the class is built on."""
    if any(is_determined_trial_base(klass) for klass in cls.__mro__):
        return importlib.import_module("determined.pytorch")
    return importlib.import_module("lightning_bridge")


class AdapterMixin:
    """The trial logic of `LightningAdapter`, independent of the `PyTorchTrial` base."""

    _lb_module_class: type | None = None
    _lb_datamodule_class: type | None = None

    def __init__(
        self,
        context: Any,
        lightning_module: pl.LightningModule | None = None,
        datamodule: pl.LightningDataModule | None = None,
    ) -> None:
        self.context = context
        hparams = dict(context.get_hparams())
        if lightning_module is None:
            if self._lb_module_class is None:
                raise InvalidTrialError(
                    "LightningAdapter needs a LightningModule: call "
                    "super().__init__(context, MyModule(...)) or use lightning_trial(MyModule)."
                )
            lightning_module = build_from_hparams(
                self._lb_module_class, hparams, context, "LightningModule"
            )
        if datamodule is None and self._lb_datamodule_class is not None:
            datamodule = build_from_hparams(
                self._lb_datamodule_class, hparams, context, "LightningDataModule"
            )
        if not isinstance(lightning_module, pl.LightningModule):
            raise InvalidTrialError(
                f"LightningAdapter takes a lightning.pytorch.LightningModule; got "
                f"{type(lightning_module).__name__}."
            )
        if datamodule is not None and not isinstance(datamodule, pl.LightningDataModule):
            raise InvalidTrialError(
                f"datamodule must be a lightning.pytorch.LightningDataModule; got "
                f"{type(datamodule).__name__}."
            )
        self.lightning_module = lightning_module
        self.datamodule = datamodule
        self._check_supported(context)
        api = _api_of(type(self))
        self._api = api
        context.experimental.disable_dataset_reproducibility_checks()
        context.experimental.disable_auto_to_device()
        algo = hparams.get("gradient_clip_algorithm")
        self._trainer = StandInTrainer(self, hparams.get("gradient_clip_val"), algo)
        self._log = LogRouter(lambda: _distributed() and self.context.distributed.size > 1)
        self._epoch_len: int | None = None
        self._pending_plateau = False
        lightning_module.trainer = self._trainer  # type: ignore[assignment]
        if datamodule is not None:
            datamodule.trainer = self._trainer  # type: ignore[assignment]
        router = self._log
        lightning_module.log = types.MethodType(  # type: ignore[method-assign]
            lambda module, *args, **kwargs: router.log(module, *args, **kwargs), lightning_module
        )
        self._setup()
        self.model = context.wrap_model(lightning_module)
        optimizers, configs = parse_optimizers(lightning_module, self._call("configure_optimizers"))
        self.optimizers = [context.wrap_optimizer(opt) for opt in optimizers]
        manual = api.LRScheduler.StepMode.MANUAL_STEP
        for config in configs:
            context.wrap_lr_scheduler(config.scheduler, step_mode=manual)
        self._trainer.optimizers = list(optimizers)
        self._trainer.lr_scheduler_configs = configs
        self._trainer.strategy._lightning_optimizers = [
            LightningOptimizer._to_lightning_optimizer(opt, self._trainer.strategy)  # type: ignore[arg-type]
            for opt in optimizers
        ]
        self._train_reducer = context.wrap_reducer(
            adapter_reducer(api, router.training_state, router.reset_window, combine_training),
            name=None,
            for_training=True,
            for_validation=False,
        )
        self._val_reducer = context.wrap_reducer(
            adapter_reducer(api, router.validation_state, router.val.reset, combine_validation),
            name=None,
            for_training=False,
            for_validation=True,
        )

    # ----- construction -----

    def _check_supported(self, context: Any) -> None:
        from lightning_bridge.adapter._hooks import refusals

        problems = refusals(self.lightning_module, self.datamodule, context)
        if problems:
            raise InvalidTrialError(problems[0])

    def _setup(self) -> None:
        module, dm = self.lightning_module, self.datamodule
        if self.context.distributed.local_rank == 0:
            if dm is not None:
                dm.prepare_data()
            self._call("prepare_data")
        if self.context.distributed.size > 1:
            self.context.distributed.allgather(None)  # the others wait for the data
        if dm is not None:
            dm.setup(stage="fit")
        self._call("setup", "fit")
        self._call("configure_model")
        if is_overridden("configure_sharded_model", module):
            self._call("configure_sharded_model")

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """Run a module hook with its name as `_current_fx_name` (what `self.log` checks)."""
        module = self.lightning_module
        previous = module._current_fx_name
        module._current_fx_name = hook
        try:
            return getattr(module, hook)(*args, **kwargs)
        finally:
            module._current_fx_name = previous

    # ----- data -----

    def _loader(self, hook: str, *, shuffle: bool) -> Any:
        owner = hook_owner(hook, self.lightning_module, self.datamodule)
        if owner is self.lightning_module:
            loader = self._call(hook)
        else:
            loader = getattr(owner, hook)()
        loader = single_loader(loader, hook)
        dist = self.context.distributed
        return distributed_loader(loader, dist.rank, dist.size, shuffle=shuffle)

    def build_training_data_loader(self) -> Any:
        if not is_overridden("train_dataloader", self.lightning_module) and not (
            self.datamodule is not None and is_overridden("train_dataloader", self.datamodule)
        ):
            raise InvalidTrialError(
                f"{type(self.lightning_module).__name__} has no train_dataloader(): define it on "
                "the module or pass a LightningDataModule that defines it."
            )
        loader = self._loader("train_dataloader", shuffle=True)
        try:
            self._epoch_len = len(loader)
            self._trainer.num_training_batches = self._epoch_len
        except TypeError:
            self._epoch_len = None
        return RepeatingLoader(loader, self.context.get_initial_batch)

    def build_validation_data_loader(self) -> Any:
        return self._loader("val_dataloader", shuffle=False)

    def _transfer(self, batch: Any) -> Any:
        """Lightning's batch transfer hooks, then the batch is on the module's device."""
        module, dm = self.lightning_module, self.datamodule
        device = self.lightning_module.device
        for hook, args in (
            ("on_before_batch_transfer", (0,)),
            ("transfer_batch_to_device", (device, 0)),
            ("on_after_batch_transfer", (0,)),
        ):
            owner = hook_owner(hook, module, dm)
            if owner is module:
                batch = self._call(hook, batch, *args)
            else:
                batch = getattr(owner, hook)(batch, *args)
        return batch

    # ----- training -----

    def _step_args(self, fn: Any, batch: Any, batch_idx: int) -> tuple:
        params = inspect.signature(fn).parameters
        takes_idx = (
            "batch_idx" in params
            or len(params) > 1
            or any(p.kind is p.VAR_POSITIONAL for p in params.values())
        )
        return (batch, batch_idx) if takes_idx else (batch,)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        module, trainer = self.lightning_module, self._trainer
        in_epoch = batch_idx % self._epoch_len if self._epoch_len else batch_idx
        trainer.current_epoch = epoch_idx
        trainer.state.stage = RunningStage.TRAINING
        if self._pending_plateau:
            self._flush_plateau()
        batch = self._transfer(batch)
        self._log.start_batch(self._log.train, batch)
        if self._call("on_train_batch_start", batch, in_epoch) == -1:
            raise InvalidTrialError(
                "on_train_batch_start() returned -1 to skip the rest of the epoch; a trial "
                "cannot end an epoch early. Stop training with self.trainer.should_stop = True."
            )
        args = self._step_args(module.training_step, batch, in_epoch)
        if module.automatic_optimization:
            outputs, loss = self._automatic_step(args, epoch_idx, in_epoch)
        else:
            outputs = self._call("training_step", *args)
            loss = _loss_of(outputs, automatic=False)
        configs, metrics = trainer.lr_scheduler_configs, self._log.callback_metrics
        step_schedulers(
            module, self._call, configs, metrics, interval="step", plateau=False, index=in_epoch
        )
        last = self._epoch_len is not None and in_epoch == self._epoch_len - 1
        if last:
            step_schedulers(
                module,
                self._call,
                configs,
                metrics,
                interval="epoch",
                plateau=False,
                index=epoch_idx,
            )
        self._call("on_train_batch_end", outputs, batch, in_epoch)
        step_schedulers(
            module, self._call, configs, metrics, interval="step", plateau=True, index=in_epoch
        )
        self._log.end_batch(self._log.train)
        self._log.finish_training_batch(loss)
        return {}

    def _automatic_step(self, args: tuple, epoch_idx: int, in_epoch: int) -> tuple[Any, Any]:
        trainer = self._trainer
        result: dict[str, Any] = {}
        optimizer = trainer.optimizers[0] if trainer.optimizers else None

        @torch.enable_grad()
        def closure() -> Any:
            out = self._call("training_step", *args)
            loss = _loss_of(out, automatic=True)
            result["out"], result["loss"] = out, loss
            if optimizer is not None:
                self._call("on_before_zero_grad", optimizer)
                self._call("optimizer_zero_grad", epoch_idx, in_epoch, optimizer)
                if loss is not None:
                    trainer.strategy.backward(loss, optimizer)
            return loss

        if optimizer is None:
            closure()
        else:
            lopt = trainer.strategy._lightning_optimizers[0]
            self._call("optimizer_step", epoch_idx, in_epoch, lopt, closure)
        out = result.get("out")
        return (out.detach() if isinstance(out, torch.Tensor) else out), result.get("loss")

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._call("on_before_backward", loss)
        if is_overridden("backward", self.lightning_module):
            self._call("backward", loss, *args, **kwargs)
        else:
            names = ("gradient", "retain_graph", "create_graph")
            kwargs.update(dict(zip(names, args, strict=False)))
            if set(kwargs) - set(names):
                raise InvalidTrialError(
                    f"manual_backward() got {sorted(set(kwargs) - set(names))}; a trial's "
                    "backward takes gradient, retain_graph and create_graph."
                )
            self.context.backward(loss, **kwargs)
        self._call("on_after_backward")

    def _optimizer_step(self, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise InvalidTrialError(
                f"optimizer.step() got {sorted(kwargs)}; a trial steps optimizers without "
                "extra arguments."
            )
        result = closure()
        module, trainer = self.lightning_module, self._trainer

        def before_step(params: Any) -> None:
            self._call("on_before_optimizer_step", optimizer)
            if module.automatic_optimization:
                self._call(
                    "configure_gradient_clipping",
                    optimizer,
                    gradient_clip_val=trainer.gradient_clip_val,
                    gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                )

        self.context.step_optimizer(optimizer, clip_grads=before_step, auto_zero_grads=False)
        trainer.global_step += 1
        return result

    # ----- validation -----

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        module = self.lightning_module
        self._trainer.state.stage = RunningStage.VALIDATING
        batch = self._transfer(batch)
        self._log.start_batch(self._log.val, batch)
        self._call("on_validation_batch_start", batch, batch_idx)
        out = self._call(
            "validation_step", *self._step_args(module.validation_step, batch, batch_idx)
        )
        self._call("on_validation_batch_end", out, batch, batch_idx)
        self._log.end_batch(self._log.val)
        return {}

    # ----- epoch-level moments (called by the adapter's PyTorchCallback) -----

    def _flush_plateau(self) -> None:
        self._pending_plateau = False
        step_schedulers(
            self.lightning_module,
            self._call,
            self._trainer.lr_scheduler_configs,
            self._log.callback_metrics,
            interval="epoch",
            plateau=True,
            index=self._trainer.current_epoch,
        )

    def build_callbacks(self) -> dict[str, Any]:
        return {"lightning_adapter": adapter_callback(self._api, self)}

    def get_batch_length(self, batch: Any) -> int:
        from lightning.pytorch.utilities.data import extract_batch_size

        return int(extract_batch_size(batch))


def _loss_of(out: Any, *, automatic: bool) -> torch.Tensor | None:
    """The loss in `training_step`'s output (a tensor, a dict with "loss", or None)."""
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        loss = out.get("loss")
        if loss is None and automatic:
            raise InvalidTrialError(
                'training_step() returned a dict without a "loss" key; under automatic '
                'optimization return the loss tensor, a dict with "loss", or None.'
            )
        return loss if isinstance(loss, torch.Tensor) else None
    if automatic:
        raise InvalidTrialError(
            "training_step() must return a Tensor, a dict with a 'loss' key, or None under "
            f"automatic optimization; got {type(out).__name__}."
        )
    return None
