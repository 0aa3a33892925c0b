"""A ported module's training batch, as `lightning.Trainer`'s training epoch loop runs it.

Automatic optimization follows Lightning's closure: `training_step` (under the precision
plugin's context), the loss divided by `accumulate_grad_batches`, zeroing the gradients on the
first batch of each accumulation group, backward through `context.backward`; on the group's
last batch (or the epoch's last) the module's `optimizer_step` hook steps the optimizer through
`context.step_optimizer`, with `on_before_optimizer_step` and gradient clipping right before.
The LR schedulers are stepped at Lightning's moments (`_optim`). Callbacks' batch hooks run
before the module's, as in Lightning.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from lightning.pytorch.trainer.states import RunningStage

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._data import hook_owner
from lightning_bridge.adapter._optim import step_schedulers


def loss_of(out: Any, *, automatic: bool) -> torch.Tensor | None:
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


def step_args(fn: Any, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> tuple:
    """(batch, batch_idx[, dataloader_idx]) as far as `fn` takes them."""
    params = inspect.signature(fn).parameters
    takes_idx = (
        "batch_idx" in params
        or len(params) > 1
        or any(p.kind is p.VAR_POSITIONAL for p in params.values())
    )
    args: tuple = (batch, batch_idx) if takes_idx else (batch,)
    return args if dataloader_idx is None else (*args, dataloader_idx)


class TrainingSteps:
    """`train_batch` and the optimization it runs (mixed into `AdapterMixin`)."""

    context: Any
    lightning_module: Any
    datamodule: Any
    _trainer: Any
    _log: Any
    _callbacks: Any
    _precision: Any
    _settings: Any
    _epoch_len: int | None
    _pending: list[str]
    _accumulating: bool
    _in_epoch: int

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _hook(self, hook: str, *args: Any) -> Any:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def _transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """Lightning's input conversion and batch transfer hooks, then the batch is on the
        module's device."""
        module, dm = self.lightning_module, self.datamodule
        batch = self._precision.convert_input(batch)
        device = module.device
        for hook, args in (
            ("on_before_batch_transfer", (dataloader_idx,)),
            ("transfer_batch_to_device", (device, dataloader_idx)),
            ("on_after_batch_transfer", (dataloader_idx,)),
        ):
            owner = hook_owner(hook, module, dm)
            if owner is module:
                batch = self._call(hook, batch, *args)
            else:
                batch = getattr(owner, hook)(batch, *args)
        return batch

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self._flush()
        module, trainer = self.lightning_module, self._trainer
        in_epoch = batch_idx % self._epoch_len if self._epoch_len else batch_idx
        last = self._epoch_len is not None and in_epoch == self._epoch_len - 1
        self._in_epoch = in_epoch
        trainer.current_epoch = epoch_idx
        trainer.state.stage = RunningStage.TRAINING
        batch = self._transfer(batch)
        self._log.start_batch(self._log.train, batch)
        self._callbacks.call("on_train_batch_start", batch, in_epoch)
        if self._call("on_train_batch_start", batch, in_epoch) == -1:
            raise InvalidTrialError(
                "on_train_batch_start() returned -1 to skip the rest of the epoch; a trial "
                "cannot end an epoch early. Stop training with self.trainer.should_stop = True."
            )
        accumulate = int(trainer.accumulate_grad_batches)
        self._accumulating = bool(
            module.automatic_optimization and (in_epoch + 1) % accumulate != 0 and not last
        )
        if module.automatic_optimization:
            outputs, loss = self._automatic_step(batch, epoch_idx, in_epoch, accumulate)
        else:
            args = step_args(module.training_step, batch, in_epoch)
            with self._precision.train_step_context():
                outputs = self._call("training_step", *args)
            loss = loss_of(outputs, automatic=False)
        configs, metrics = trainer.lr_scheduler_configs, self._log.callback_metrics
        if not self._accumulating:
            step_schedulers(module, self._call, configs, metrics, "step", False, in_epoch)
        if last:
            step_schedulers(module, self._call, configs, metrics, "epoch", False, epoch_idx)
        self._hook("on_train_batch_end", outputs, batch, in_epoch)
        self._log.end_batch(self._log.train)
        self._log.finish_training_batch(loss)
        if not self._accumulating:
            # ReduceLROnPlateau stepped by batch: after the validation this batch may end in.
            self._pending.append("step_plateau")
        return {}

    def _step_plateau(self) -> None:
        module, configs = self.lightning_module, self._trainer.lr_scheduler_configs
        metrics = self._log.callback_metrics
        step_schedulers(module, self._call, configs, metrics, "step", True, self._in_epoch)

    def _automatic_step(
        self, batch: Any, epoch_idx: int, in_epoch: int, accumulate: int
    ) -> tuple[Any, Any]:
        module, trainer = self.lightning_module, self._trainer
        args = step_args(module.training_step, batch, in_epoch)
        result: dict[str, Any] = {}
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        first_of_group = in_epoch % accumulate == 0

        @torch.enable_grad()
        def closure() -> Any:
            with self._precision.train_step_context():
                out = self._call("training_step", *args)
            loss = loss_of(out, automatic=True)
            result["out"], result["loss"] = out, loss
            if loss is not None and accumulate > 1:
                loss = loss / accumulate  # as Lightning normalizes an accumulated loss
            if optimizer is not None and loss is not None:
                if first_of_group:
                    self._hook("on_before_zero_grad", optimizer)
                    self._call("optimizer_zero_grad", epoch_idx, in_epoch, optimizer)
                trainer.strategy.backward(loss, optimizer)
            return loss

        if optimizer is None or self._accumulating:
            closure()
        else:
            lopt = trainer.strategy._lightning_optimizers[0]
            self._call("optimizer_step", epoch_idx, in_epoch, lopt, closure)
        out = result.get("out")
        return (out.detach() if isinstance(out, torch.Tensor) else out), result.get("loss")

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._hook("on_before_backward", loss)
        if self._overrides("backward"):
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
        self._hook("on_after_backward")

    def _overrides(self, hook: str) -> bool:
        raise NotImplementedError

    def _optimizer_step(self, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise InvalidTrialError(
                f"optimizer.step() got {sorted(kwargs)}; a trial steps optimizers without "
                "extra arguments."
            )
        result = closure()
        module, trainer = self.lightning_module, self._trainer

        def before_step(params: Any) -> None:
            self._hook("on_before_optimizer_step", optimizer)
            if module.automatic_optimization:
                self._call(
                    "configure_gradient_clipping",
                    optimizer,
                    gradient_clip_val=trainer.gradient_clip_val,
                    gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                )

        # With the trial's own gradient aggregation, Determined zeroes after its steps.
        self.context.step_optimizer(
            optimizer, clip_grads=before_step, auto_zero_grads=self._settings.aggregation
        )
        trainer.global_step += 1
        return result
