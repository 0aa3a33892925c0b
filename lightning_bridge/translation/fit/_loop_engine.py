"""`LoopEngine`: what `FitLoop` needs of the engine that runs a trial's steps.

Two engines implement it: `FabricEngine` (a `PyTorchTrial` on `lightning.Fabric`: the
strategy's wrapper, the precision plugin's autocast) and DeepSpeedTrial's `DeepSpeedEngines`
(the engines the trial built with `deepspeed.initialize`, which do their own backward passes
and steps). The loop draws batches, asks the schedule, checkpoints and stops the same way for
both; only running a step and validation mode differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch


class LoopEngine(Protocol):
    """Runs a trial's training and validation steps for `FitLoop`."""

    device: torch.device

    @property
    def direct(self) -> bool:
        """Whether a step is a plain call the loop may make itself (no wrapper, no autocast)."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` as the engine runs a step."""

    def evaluating(self, models: list[Any]) -> contextlib.AbstractContextManager[None]:
        """Validation mode for `models` while the context is open (no gradients, eval mode)."""
