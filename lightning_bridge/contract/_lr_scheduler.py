"""`LRScheduler`: a torch LR scheduler plus when the bridge steps it.

The bridge steps wrapped schedulers itself at Determined's moments (every batch, every optimizer
step, every epoch, or never); Lightning's own scheduler stepping is not used for them.
"""

from __future__ import annotations

import enum
from typing import Any

from lightning_bridge._errors import InvalidTrialError, TrialTypeError
from lightning_bridge.contract._determined_compat import as_bridge_enum


class LRScheduler:
    """A wrapped learning-rate scheduler with its step mode and frequency."""

    class StepMode(enum.Enum):
        """When the bridge calls `scheduler.step()`."""

        STEP_EVERY_EPOCH = 1
        STEP_EVERY_BATCH = 2
        MANUAL_STEP = 3
        STEP_EVERY_OPTIMIZER_STEP = 4

    def __init__(self, scheduler: Any, step_mode: StepMode, frequency: int = 1) -> None:
        step_mode = as_bridge_enum(step_mode, LRScheduler.StepMode)
        if not isinstance(step_mode, LRScheduler.StepMode):
            raise TrialTypeError(
                "step_mode must be an LRScheduler.StepMode member, e.g. "
                "LRScheduler.StepMode.STEP_EVERY_BATCH; "
                f"got {step_mode!r} of type {type(step_mode).__name__}."
            )
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise InvalidTrialError(
                f"frequency must be an int >= 1 (step every N batches or epochs); "
                f"got {frequency!r}."
            )
        self._scheduler = scheduler
        self._step_mode = step_mode
        self._frequency = frequency

    def step(self, *args: Any, **kwargs: Any) -> None:
        self._scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list:
        return list(self._scheduler.get_last_lr())

    def state_dict(self) -> dict[Any, Any]:
        return dict(self._scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[Any, Any]) -> None:
        self._scheduler.load_state_dict(state_dict)


def step_count(
    mode: LRScheduler.StepMode,
    frequency: int,
    batch_idx: int,
    aggregation_frequency: int,
    epoch_len: int,
) -> int:
    """How many times to step a scheduler after batch `batch_idx`, which stepped the optimizers.

    Called only on batches where the optimizers step (every `aggregation_frequency` batches).
    Batch mode counts every batch since the previous optimizer step; epoch mode steps once for
    every epoch boundary crossed before the next optimizer step.
    """
    if mode is LRScheduler.StepMode.STEP_EVERY_BATCH:
        first = batch_idx - aggregation_frequency + 1
        return sum(1 for i in range(first, batch_idx + 1) if (i + 1) % frequency == 0)
    if mode is LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP:
        return 1 if (batch_idx + 1) % frequency == 0 else 0
    if mode is LRScheduler.StepMode.STEP_EVERY_EPOCH:
        this_epoch = batch_idx // epoch_len
        next_epoch = (batch_idx + aggregation_frequency) // epoch_len
        return sum(1 for e in range(this_epoch, next_epoch) if (e + 1) % frequency == 0)
    return 0
