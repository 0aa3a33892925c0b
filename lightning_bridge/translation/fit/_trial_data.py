"""The trial's data as Lightning's loops see it.

`build_trial_data` builds the trial's loaders in Determined's order: the training loader
repeated, sharded across processes and skipping the batches a continued run already trained
(with the data position tracked for exact continuation), then the validation loader. The
bridge's own loop draws batches from the one endless training iterator; a `lightning.Trainer`
gets an `EpochFeed` over it (one iteration = one trial epoch), the validation loader as a
`LoaderFeed` and, for `evaluate_full_dataset` trials, a `FullDatasetPass` of a single
placeholder batch.

The data position is exact across pause and continue. A shuffling sampler draws its permutation
from torch's global RNG when a pass over the data starts. `PassTracker` wraps the trial's batch
sampler (inside the repeat) and records the RNG state at the start of each pass; checkpoints
carry the state of the pass in progress. When a run continues, the tracker replays the passes
already finished and the finished part of the current one without disturbing the restored RNG,
and starts the current pass from the state it originally started from, so the remaining batches
come in the same order as if the run had never stopped.

A checkpoint without that record (one Determined wrote, or any writer without the bridge's
entry) continues mid-epoch as Determined continues it: Determined restores the RNG, then draws
the order of every pass up to the one in progress again, one after the other, while it skips
the batches already trained, so the rest of the pass comes in that last order (not the one the
interrupted run was taking, which only the pass-start record keeps). At an epoch end no pass is
in progress and the next pass draws from the checkpoint's RNG, as the uninterrupted run did.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError, TrialRuntimeError
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._data import dataset_repro_message, is_trial_data_loader


class EpochFeed:
    """The training data as Lightning sees it: each iteration yields one trial epoch.

    All epochs draw from one iterator over the repeated (and sharded, skipped) training loader,
    created once like Determined does, so data order and RNG use match an uninterrupted run.
    Its length is the trial's epoch: a run `lightning.Trainer` restores from its own checkpoint
    (`ckpt_path`) counts the batches its epoch already trained and draws only the rest. A run
    whose trial continues without Lightning's counters (`first_offset` batches of the current
    epoch trained) first finishes that epoch: Lightning's first epoch is `first_offset`
    shorter, until `epoch_ended()`.
    """

    def __init__(self, iterator: Iterator, epoch_len: int, first_offset: int = 0) -> None:
        self._iterator = iterator
        self._epoch_len = epoch_len
        self._offset = first_offset

    def __len__(self) -> int:
        return self._epoch_len - self._offset

    def epoch_ended(self) -> None:
        """Lightning finished an epoch: the next ones are whole trial epochs."""
        self._offset = 0

    def __iter__(self) -> Iterator:
        # Lightning stops drawing at its own count (the length, less what a restored epoch
        # trained); nothing is drawn before it asks.
        for _ in range(len(self)):
            try:
                yield next(self._iterator)
            except StopIteration:
                return


class FullDatasetPass:
    """Validation "loader" of one placeholder batch: `evaluate_full_dataset` runs once, as a
    single validation step, and receives the real validation loader itself."""

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[None]:
        yield None


class LoaderFeed:
    """The trial's validation loader as Lightning sees it: a sized iterable, not a
    `DataLoader`, so Lightning keeps the trial's own (Determined's) sharding."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        # A generator: the loader's iterator (which draws its seed from torch's RNG) starts at
        # the first batch, not when Lightning calls `iter()` only to check the data is
        # iterable (it does for anything but a DataLoader), so the RNG stays Determined's.
        yield from self.loader


@dataclasses.dataclass
class TrialData:
    """The built loaders: the endless training iterator (already past the batches a continued
    run trained), its batches per epoch (agreed by every process), the validation loader and
    the data position."""

    iterator: Iterator
    epoch_len: int
    val_loader: Any
    tracker: PassTracker | None


def _loader(
    ctx: PyTorchTrialContext, built: Any, fn_name: str, *, repeat: bool, shard: bool, skip: int
) -> tuple[Any, PassTracker | None]:
    dist = ctx.distributed
    tracker = None
    if is_trial_data_loader(built):
        if repeat:
            built, tracker = tracked_loader(built, {})
        loader = built.get_data_loader(
            repeat=repeat,
            skip=skip,
            num_replicas=dist.size if shard else 1,
            rank=dist.rank if shard else 0,
        )
        return loader, tracker
    if not ctx.experimental._data_repro_checks_disabled:
        raise TrialRuntimeError(dataset_repro_message(fn_name, built))
    return built, None


def build_trial_data(
    trial: Any,
    ctx: PyTorchTrialContext,
    *,
    evaluate_batch: bool,
    start_batch: int,
    saved: dict[str, Any],
    chief: bool,
    on_epoch_len: Callable[[int], None] | None = None,
) -> TrialData:
    """Build the loaders (see the module docstring); `chief`: this process builds the
    validation loader of `evaluate_full_dataset`.

    `saved` is the bridge's entry of the checkpoint being continued (the data position), or
    an empty dict for a fresh start. `on_epoch_len` is told the epoch length as soon as it is
    known, before the validation loader is built (Determined's `context._epoch_len` is set
    there).
    """
    train, tracker = _loader(
        ctx,
        trial.build_training_data_loader(),
        "build_training_data_loader",
        repeat=True,
        shard=True,
        skip=start_batch,
    )
    try:
        epoch_len = len(train)
    except TypeError:
        epoch_len = 2**62
    if epoch_len == 0:
        raise InvalidTrialError(
            "The training data loader yields no batches: check the dataset size and "
            "batch_size (with drop_last=True a dataset smaller than one batch is empty)."
        )
    epoch_len = ctx.distributed.broadcast(epoch_len)
    if on_epoch_len is not None:
        on_epoch_len(epoch_len)
    if tracker is not None and start_batch:
        done, in_epoch = divmod(start_batch, epoch_len)
        if in_epoch and "pass_start_rng" not in saved:
            # Mid-epoch without the bridge's record (a checkpoint Determined wrote): continue
            # as Determined does, every pass so far drawn again from the restored RNG.
            done = 0
        tracker._resume_passes = done
        tracker._resume_rng = saved.get("pass_start_rng") if in_epoch else None
    validation = trial.build_validation_data_loader()
    val_loader = None
    if evaluate_batch:
        val_loader, _ = _loader(
            ctx, validation, "build_validation_data_loader", repeat=False, shard=True, skip=0
        )
        try:
            empty = len(val_loader) == 0
        except TypeError:
            empty = False
        if empty:
            raise TrialRuntimeError(
                "The validation data loader yields no batches: give "
                "build_validation_data_loader() a non-empty dataset."
            )
    elif chief:
        val_loader, _ = _loader(
            ctx, validation, "build_validation_data_loader", repeat=False, shard=False, skip=0
        )
    return TrialData(iter(train), epoch_len, val_loader, tracker)


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
