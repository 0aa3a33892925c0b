"""A ported module's training step and optimization, as `lightning.Trainer` runs them.

Automatic optimization follows Lightning's closure: `training_step` (under the precision
plugin's context), the loss divided by `accumulate_grad_batches`, zeroing the gradients on the
first batch of each accumulation group, backward through `context.backward`; on the group's
last batch (or the epoch's last) the module's `optimizer_step` hook steps the optimizer through
`context.step_optimizer`, with `on_before_optimizer_step` and gradient clipping right before.
Under manual optimization `training_step` runs alone and the module's `manual_backward` /
`optimizer.step()` reach `backward` / `optimizer_step` here through the stand-in strategy.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_callbacks import Hooks
from lightning_bridge.adapter._stand_in_trainer import StandInTrainer
from lightning_bridge.translation._lightning_private import lightning_optimizers


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


class Optimization:
    """`training_step` and what it drives: backward and optimizer steps through the context."""

    def __init__(
        self,
        context: Any,
        hooks: Hooks,
        trainer: StandInTrainer,
        precision_plugin: Any,
        *,
        aggregation: bool,
    ) -> None:
        self._context = context
        self._hooks = hooks
        self._module = hooks.module
        self._trainer = trainer
        self._precision = precision_plugin
        # With the trial's own gradient aggregation, Determined zeroes after its steps.
        self._aggregation = aggregation
        trainer.strategy.route(self.backward, self.optimizer_step)

    def training_step(
        self, batch: Any, epoch_idx: int, in_epoch: int, accumulating: bool
    ) -> tuple[Any, torch.Tensor | None]:
        """Run `training_step` (and under automatic optimization its backward and, unless
        `accumulating`, the optimizer step); (its output, its loss)."""
        module = self._module
        args = step_args(module.training_step, batch, in_epoch)
        if not module.automatic_optimization:
            with self._precision.train_step_context():
                outputs = self._hooks.call("training_step", *args)
            return outputs, loss_of(outputs, automatic=False)
        accumulate = int(self._trainer.accumulate_grad_batches)
        trainer, hooks = self._trainer, self._hooks
        result: dict[str, Any] = {}
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        first_of_group = in_epoch % accumulate == 0

        @torch.enable_grad()
        def closure() -> Any:
            with self._precision.train_step_context():
                out = hooks.call("training_step", *args)
            loss = loss_of(out, automatic=True)
            result["out"], result["loss"] = out, loss
            if loss is not None and accumulate > 1:
                loss = loss / accumulate  # as Lightning normalizes an accumulated loss
            if optimizer is not None and loss is not None:
                if first_of_group:
                    hooks.run("on_before_zero_grad", optimizer)
                    hooks.call("optimizer_zero_grad", epoch_idx, in_epoch, optimizer)
                trainer.strategy.backward(loss, optimizer)
            return loss

        if optimizer is None or accumulating:
            closure()
        else:
            lopt = lightning_optimizers(trainer.strategy)[0]
            hooks.call("optimizer_step", epoch_idx, in_epoch, lopt, closure)
        out = result.get("out")
        return (out.detach() if isinstance(out, torch.Tensor) else out), result.get("loss")

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """`manual_backward` / the closure's backward: the module's override or the context's."""
        self._hooks.run("on_before_backward", loss)
        if self._hooks.overrides("backward"):
            self._hooks.call("backward", loss, *args, **kwargs)
        else:
            names = ("gradient", "retain_graph", "create_graph")
            kwargs.update(dict(zip(names, args, strict=False)))
            if set(kwargs) - set(names):
                raise InvalidTrialError(
                    f"manual_backward() got {sorted(set(kwargs) - set(names))}; a trial's "
                    "backward takes gradient, retain_graph and create_graph."
                )
            self._context.backward(loss, **kwargs)
        self._hooks.run("on_after_backward")

    def optimizer_step(self, optimizer: Any, closure: Any, **kwargs: Any) -> Any:
        """`optimizer.step(closure)`: the closure, then `context.step_optimizer` with
        `on_before_optimizer_step` and gradient clipping right before the step."""
        if kwargs:
            raise InvalidTrialError(
                f"optimizer.step() got {sorted(kwargs)}; a trial steps optimizers without "
                "extra arguments."
            )
        result = closure()
        module, trainer, hooks = self._module, self._trainer, self._hooks

        def before_step(params: Any) -> None:
            hooks.run("on_before_optimizer_step", optimizer)
            if module.automatic_optimization:
                hooks.call(
                    "configure_gradient_clipping",
                    optimizer,
                    gradient_clip_val=trainer.gradient_clip_val,
                    gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                )

        self._context.step_optimizer(
            optimizer, clip_grads=before_step, auto_zero_grads=self._aggregation
        )
        trainer.global_step += 1
        return result
