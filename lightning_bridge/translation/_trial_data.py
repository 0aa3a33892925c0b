"""The trial's data as Lightning's loops see it.

`build_trial_data` builds the trial's loaders in Determined's order: the training loader
repeated, sharded across processes and skipping the batches a continued run already trained
(with the data position tracked for exact continuation), then the validation loader. The
bridge's own loop draws batches from the one endless training iterator; a `lightning.Trainer`
gets an `EpochFeed` over it (one iteration = one trial epoch) and, for
`evaluate_full_dataset` trials, a `FullDatasetPass` of a single placeholder batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidTrialError, TrialRuntimeError
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._data import dataset_repro_message, is_trial_data_loader
from lightning_bridge.translation._data_position import PassTracker, tracked_loader


class EpochFeed:
    """The training data as Lightning sees it: each iteration yields one trial epoch.

    All epochs draw from one iterator over the repeated (and sharded, skipped) training loader,
    created once like Determined does, so data order and RNG use match an uninterrupted run.
    """

    def __init__(self, iterator: Iterator, epoch_len: int, first_offset: int = 0) -> None:
        self._iterator = iterator
        self._epoch_len = epoch_len
        # A run continued mid-epoch first finishes that epoch.
        self._offset = first_offset

    def __len__(self) -> int:
        return self._epoch_len - self._offset

    def __iter__(self) -> Iterator:
        count, self._offset = self._epoch_len - self._offset, 0
        for _ in range(count):
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
) -> TrialData:
    """Build the loaders (see the module docstring); `chief`: this process builds the
    validation loader of `evaluate_full_dataset`.

    `saved` is the bridge's entry of the checkpoint being continued (the data position), or
    an empty dict for a fresh start.
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
    if tracker is not None and start_batch:
        done, in_epoch = divmod(start_batch, epoch_len)
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
