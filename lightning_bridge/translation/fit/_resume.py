"""Continuation or warm start: what `fit(latest_checkpoint=...)` does with a checkpoint.

A checkpoint of the same trial (its trial id is this run's) is continued: every counter, the
data position and pending gradients come back and training goes on bit for bit. A checkpoint of
another trial (a Determined cluster's, or one named by `searcher.source_checkpoint_uuid`)
starts a new run from it, as Determined does: weights, optimizer, LR scheduler, callback and
RNG states are restored, the batch count and the data start at 0.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._layout import TrialState

logger = logging.getLogger("lightning_bridge")


def starts_new_run(
    state: TrialState | None, trial_id: int, warm_start: bool | None, checkpoint: Any
) -> bool:
    """Whether loading `checkpoint` starts a new run (True) or continues its run (False)."""
    if warm_start is not None and not isinstance(warm_start, bool):
        raise InvalidArgumentError(f"warm_start must be True, False or None; got {warm_start!r}.")
    if warm_start is None:
        warm_start = state is not None and state.trial_id != trial_id
        if warm_start:
            assert state is not None
            logger.warning(
                "Checkpoint %s was written by trial %s, not this trial (%s): starting a new run "
                "from its weights, optimizer and RNG state at batch 0, as Determined does. Pass "
                "warm_start=False to continue its run instead.",
                checkpoint,
                state.trial_id,
                trial_id,
            )
    elif warm_start:
        logger.info("Starting a new run from checkpoint %s (warm start).", checkpoint)
    return warm_start
