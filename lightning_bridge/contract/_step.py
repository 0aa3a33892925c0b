"""What happens around an optimizer step, and who runs backward passes and steps in a fit.

`prepare_step` averages accumulated gradients and clips them right before `optimizer.step()`.
`StepDriver` is what the context hands `backward` and `step_optimizer` to while a fit runs:
the translation layer's `TrialModule`, which routes them through Lightning's strategy and
precision plugin. The contract only knows this protocol, never the module itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch


class StepDriver(Protocol):
    """Runs a trial's backward passes and optimizer steps inside the engine."""

    def run_backward(self, loss: torch.Tensor, sync_gradients: bool, **kwargs: Any) -> None:
        """Backward pass of `loss`; `sync_gradients=False` skips the gradient all-reduce."""

    def run_step(
        self, optimizer: torch.optim.Optimizer, clip_grads: Callable | None, divisor: int
    ) -> None:
        """Step `optimizer` after dividing its gradients by `divisor` and clipping them."""


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def prepare_step(
    optimizer: torch.optim.Optimizer,
    clip_grads: Callable[[Iterator], None] | None,
    divisor: int,
) -> None:
    """Average accumulated gradients, then clip them; runs right before `optimizer.step()`."""
    params = optimizer_params(optimizer)
    if divisor > 1:
        for p in params:
            if p.grad is not None:
                p.grad.div_(float(divisor))
    if clip_grads is not None:
        clip_grads(params)  # type: ignore[arg-type]
