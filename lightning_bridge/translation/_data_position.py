"""Exact data position across pause and continue.

A shuffling sampler draws its permutation from torch's global RNG when a pass over the data
starts. `PassTracker` wraps the trial's batch sampler (inside the repeat) and records the RNG
state at the start of each pass; checkpoints carry the state of the pass in progress. When a
run continues, the tracker replays the passes already finished and the finished part of the
current one without disturbing the restored RNG, and starts the current pass from the state it
originally started from, so the remaining batches come in the same order as if the run had
never stopped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch


class PassTracker:
    """A batch sampler wrapper that records (and, when resuming, restores) pass-start RNG."""

    def __init__(
        self,
        batch_sampler: Any,
        resume_passes: int = 0,
        resume_rng: torch.Tensor | None = None,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.passes_started = 0
        self.pass_start_rng: torch.Tensor | None = None
        # Passes [0, resume_passes) were finished before the checkpoint; pass resume_passes was
        # in progress and originally started from resume_rng.
        self._resume_passes = resume_passes
        self._resume_rng = resume_rng

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        index = self.passes_started
        self.passes_started += 1
        it = iter(self.batch_sampler)
        replayed = index < self._resume_passes
        resumed = index == self._resume_passes and self._resume_rng is not None
        saved = torch.random.get_rng_state()
        if resumed:
            assert self._resume_rng is not None
            torch.random.set_rng_state(self._resume_rng)
        self.pass_start_rng = torch.random.get_rng_state()
        try:
            first = next(it)
            if torch.equal(torch.random.get_rng_state(), self.pass_start_rng):
                # The sampler drew nothing (no shuffling): the pass's order does not depend
                # on the RNG, so checkpoints need not carry its state.
                self.pass_start_rng = None
        except StopIteration:
            return
        finally:
            if replayed or resumed:
                torch.random.set_rng_state(saved)
        yield first
        yield from it


def tracked_loader(built: Any, tracker_args: dict[str, Any]) -> tuple[Any, PassTracker]:
    """A shallow copy of a trial DataLoader whose batch sampler is wrapped in a `PassTracker`."""
    tracked = copy.copy(built)
    tracker = PassTracker(built.batch_sampler, **tracker_args)
    tracked.batch_sampler = tracker
    return tracked, tracker
