"""`FabricEngine`: the engine side of a `TrialCore` on `lightning.Fabric`.

Fabric's strategy and precision plugin do the work that `lightning.Trainer` did for the bridge,
called directly rather than through the Trainer's per-step hook machinery:

* the trial's models are set up under one root module, which the strategy wraps (DDP
  all-reduces their gradients; several models find their unused parameters);
* a training or validation step runs as that module's forward (Lightning's "forward
  redirection"), under the precision plugin's autocast, so the strategy sees it as its model's
  forward; on one device without autocast it is simply called;
* `context.backward` is the strategy's backward (the precision plugin scales the loss; under
  DDP the reducer is prepared first, as Lightning's manual optimization does, and batches
  that only accumulate skip the all-reduce);
* `step_optimizer` unscales the gradients where averaging or clipping needs true values,
  averages and clips them, then steps through the strategy and precision plugin (a gradient
  scaler skips steps with inf/NaN gradients and updates its scale).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import Precision
from lightning.fabric.strategies import DeepSpeedStrategy
from torch.nn.parallel import DistributedDataParallel

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._step import prepare_step
from lightning_bridge.translation._lightning_private import forward_module, prepare_for_backward


class _Step:
    """A trial step handed through the strategy's wrapper as its forward input."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args


class TrialModels(torch.nn.Module):
    """The trial's models under one root module for the strategy to wrap; its forward runs a
    step of the trial, so the step is what the strategy's wrapper sees as the forward."""

    def __init__(self, models: list[torch.nn.Module]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, step: _Step) -> Any:
        return step.fn(*step.args)


def _forward_module(module: Any) -> torch.nn.Module:
    """The strategy's wrapper inside Fabric's module wrapper (DDP, or the module itself)."""
    inner = forward_module(module)
    if not isinstance(inner, torch.nn.Module):
        raise RuntimeError(
            f"lightning {L.__version__} wraps modules in a way lightning_bridge does not know; "
            "install a supported Lightning 2.x release (2.4 to 2.6)."
        )
    return inner


class FabricEngine:
    """Runs a trial's steps, backward passes and optimizer steps on a launched Fabric."""

    def __init__(self, fabric: L.Fabric, context: PyTorchTrialContext):
        self.fabric = fabric
        self.root = TrialModels(context.models)
        wrapped = fabric.setup(self.root, *context.optimizers)
        self.module, *optimizers = wrapped if context.optimizers else (wrapped,)
        forward = _forward_module(self.module)
        self._forward = forward
        # One device, plain module: steps are called directly.
        self._redirect: torch.nn.Module | None = None if forward is self.root else forward
        self._ddp = forward if isinstance(forward, DistributedDataParallel) else None
        self._optimizers = {
            id(raw): wrapper for raw, wrapper in zip(context.optimizers, optimizers, strict=True)
        }
        self._strategy = fabric.strategy
        # DeepSpeed's engine does backward and step itself; Fabric's own calls keep track of it.
        self._through_fabric = isinstance(self._strategy, DeepSpeedStrategy)
        precision = fabric.strategy.precision
        self._precision = precision
        self._autocast = None if type(precision) is Precision else precision.forward_context
        self._scaler = getattr(precision, "scaler", None)
        self.device: torch.device = fabric.device

    @property
    def distributed(self) -> bool:
        return self._redirect is not None

    @property
    def direct(self) -> bool:
        """Whether a step is a plain call (one device, no autocast): the loop calls it."""
        return self._redirect is None and self._autocast is None

    # ----- steps -----

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` as the model's forward: through the strategy's wrapper (if any), under
        the precision plugin's autocast (if any)."""
        if self._redirect is None:
            if self._autocast is None:
                return fn(*args)
            with self._autocast():
                return fn(*args)
        with self._autocast() if self._autocast is not None else contextlib.nullcontext():
            return self._redirected(_Step(self._inner(fn), args))

    def _inner(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        ddp = self._ddp
        if ddp is None:
            return fn

        def step(*args: Any) -> Any:
            out = fn(*args)
            # The trial's backward passes already ran inside the step (the reducer was prepared
            # for each); DDP must not prepare for one more after its forward.
            ddp.require_backward_grad_sync = False
            return out

        return step

    def _redirected(self, step: _Step) -> Any:
        assert self._redirect is not None
        try:
            return self._redirect(step)
        finally:
            if self._ddp is not None:
                self._ddp.require_backward_grad_sync = True

    @contextlib.contextmanager
    def evaluating(self, models: list[torch.nn.Module]) -> Iterator[None]:
        """Validation mode: no gradients, every submodule in eval mode, each module's own
        training flag restored afterwards (as Lightning's validation loop does)."""
        modes = [(m, m.training) for model in models for m in model.modules()]
        for model in models:
            model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for m, training in modes:
                m.training = training

    # ----- the StepDriver the context calls -----

    def run_backward(self, loss: torch.Tensor, sync_gradients: bool, **kwargs: Any) -> None:
        """`context.backward`: the strategy's backward (precision plugin scales the loss)."""
        if sync_gradients or self._redirect is None:
            self._backward(loss, kwargs)
        else:
            with self.fabric.no_backward_sync(self.module, enabled=True):
                self._backward(loss, kwargs)

    def _backward(self, loss: torch.Tensor, kwargs: dict[str, Any]) -> None:
        if self._ddp is not None:
            prepare_for_backward(self._ddp, loss)
        if self._through_fabric:
            self.fabric.backward(loss, model=self.module, **kwargs)
        else:
            self._strategy.backward(loss, self._forward, **kwargs)

    def run_step(self, optimizer: Any, clip_grads: Callable | None, divisor: int) -> None:
        """`step_optimizer`: unscale if needed, average and clip, then step (strategy)."""
        wrapper = self._optimizers.get(id(optimizer))
        if wrapper is None:
            raise InvalidTrialError(
                "step_optimizer() got an optimizer the engine does not manage; step the object "
                "returned by context.wrap_optimizer()."
            )
        if clip_grads is not None or divisor > 1:
            if self._scaler is not None:
                self._precision.unscale_gradients(optimizer)
            prepare_step(optimizer, clip_grads, divisor)
        if self._through_fabric:
            wrapper.step()
        else:
            self._strategy.optimizer_step(optimizer)

    # ----- the rest of the core's Engine protocol -----

    def gradient_scaler(self) -> Any:
        return self._scaler
