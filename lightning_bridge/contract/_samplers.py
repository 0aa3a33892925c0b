"""Composable samplers that make data order reproducible across pauses, restarts and ranks.

The classes mirror ``determined.pytorch.samplers`` name for name, with the same constructor
arguments, lengths and iteration order (shuffles use a ``numpy.random.RandomState`` seeded with
the given seed, so the same seed yields the same order as Determined does).

Each sampler wraps another one, so a pipeline is built as a chain. Chains below are written
innermost first: ``A -> B`` means ``B(A(...))``. The order matters:

Record level (wrapping a ``Sampler`` of indices, before batching)::

    ReproducibleShuffleSampler -> RepeatSampler -> DistributedSampler -> SkipSampler

Batch level (wrapping a ``BatchSampler``), the order ``DataLoader.get_data_loader`` uses::

    [ReproducibleShuffleBatchSampler ->] RepeatBatchSampler -> DistributedBatchSampler
        -> SkipBatchSampler

- shuffle first: a shuffle needs one whole, finite epoch (it would never end over a repeated
  sampler), and shuffling after a skip would change what the shuffle sees;
- repeat next, so every rank sees an endless stream of epochs, each reshuffled;
- shard next, so each rank takes every ``num_workers``-th item of that stream;
- skip last, outside the repeat: it is then applied once, to resume where a run stopped.
  Wrapped inside the repeat it would drop items again at every epoch. It also sits outside the
  shard because a resumed rank counts the items *it* already consumed.

Prefer shuffling records (``ReproducibleShuffleSampler``) over shuffling whole batches
(``ReproducibleShuffleBatchSampler``): the former also varies which records share a batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np
import torch.utils.data

__all__ = [
    "DistributedBatchSampler",
    "DistributedSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "SkipBatchSampler",
    "SkipSampler",
]


def _repeat_iter(source: Iterable[Any]) -> Iterator[Any]:
    """Cycle through ``source`` forever, re-iterating it for every pass."""
    while True:
        empty = True
        for item in source:
            empty = False
            yield item
        if empty:
            raise ValueError(
                f"the wrapped sampler ({type(source).__name__}) yielded nothing, so repeating it "
                "would never produce an item; check that the dataset is not empty (and, with "
                "drop_last=True, that it holds at least one full batch)"
            )


def _sized_len(obj: Any) -> int:
    """Length of a wrapped sampler, with a message that explains an unsized one."""
    if not isinstance(obj, Sized):
        raise TypeError(
            f"the wrapped sampler ({type(obj).__name__}) has no length; wrap a sampler that "
            "defines __len__ (a finite, map-style sampler) to ask for a length"
        )
    return len(obj)


def _check_shard(num_workers: int, rank: int) -> None:
    """Validate a (num_workers, rank) pair used for sharding."""
    if rank < 0:
        raise ValueError(
            f"rank must be non-negative, got rank={rank}; pass this process's index in "
            "[0, num_workers)"
        )
    if num_workers < 1:
        raise ValueError(
            f"num_workers must be greater than zero, got num_workers={num_workers}; pass the "
            "number of replicas that share the data (1 when not distributed)"
        )
    if rank >= num_workers:
        raise ValueError(
            f"rank must be less than num_workers, got rank={rank} with "
            f"num_workers={num_workers}; ranks are numbered 0 to num_workers - 1"
        )


def _check_skip(skip: int) -> None:
    """Validate a skip count."""
    if skip < 0:
        raise ValueError(
            f"skip must be non-negative, got skip={skip}; pass the number of items already "
            "consumed (0 to start from the beginning)"
        )


def _shard_len(total: int, num_workers: int, rank: int) -> int:
    """Items rank ``rank`` receives when ``total`` items are dealt round-robin."""
    return total // num_workers + int(total % num_workers > rank)


def _shard_iter(source: Iterable[Any], num_workers: int, rank: int) -> Iterator[Any]:
    """Yield every ``num_workers``-th item of ``source``, starting at ``rank``."""
    if num_workers == 1:
        yield from source
        return
    for position, item in enumerate(source):
        if position % num_workers == rank:
            yield item


def _skip_iter(source: Iterable[Any], skip: int) -> Iterator[Any]:
    """Drop the first ``skip`` items of ``source`` and yield the rest."""
    iterator = iter(source)
    for _ in range(skip):
        try:
            next(iterator)
        except StopIteration:
            return
    yield from iterator


class RepeatSampler(torch.utils.data.Sampler):
    """Cycle through a sampler forever; the length is one pass of the wrapped sampler.

    A wrapped sampler that yields nothing raises ``ValueError`` instead of looping forever.
    """

    def __init__(self, sampler: Iterable[Any]) -> None:
        self._sampler = sampler

    def __len__(self) -> int:
        return _sized_len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        return _repeat_iter(self._sampler)


class RepeatBatchSampler(torch.utils.data.BatchSampler):
    """Cycle through a batch sampler forever; the length is one epoch of batches.

    Every pass re-iterates the wrapped sampler, so a shuffling sampler reshuffles per epoch. A
    wrapped sampler that yields nothing raises ``ValueError`` instead of looping forever.
    """

    def __init__(self, batch_sampler: Iterable[Any]) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return _sized_len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        return _repeat_iter(self.batch_sampler)


class DistributedSampler(torch.utils.data.Sampler):
    """Keep the items of one shard: item ``i`` goes to rank ``i % num_workers``.

    Unlike ``torch.utils.data.DistributedSampler`` this does not shuffle or pad; it is a link in
    a chain and accepts any wrapped sampler, finite or not.
    """

    def __init__(self, sampler: Iterable[Any], num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self._sampler = sampler
        self._num_workers = num_workers
        self._rank = rank

    def __len__(self) -> int:
        return _shard_len(_sized_len(self._sampler), self._num_workers, self._rank)

    def __iter__(self) -> Iterator[Any]:
        return _shard_iter(self._sampler, self._num_workers, self._rank)


class DistributedBatchSampler(torch.utils.data.BatchSampler):
    """Keep the batches of one shard: batch ``i`` goes to rank ``i % num_workers``.

    Over a finite batch sampler whose length does not divide evenly, lower ranks get one batch
    more than higher ranks; wrap a ``RepeatBatchSampler`` when ranks must stay in step.
    """

    def __init__(self, batch_sampler: Iterable[Any], num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.rank = rank

    def __len__(self) -> int:
        return _shard_len(_sized_len(self.batch_sampler), self.num_workers, self.rank)

    def __iter__(self) -> Iterator[Any]:
        return _shard_iter(self.batch_sampler, self.num_workers, self.rank)


class SkipSampler(torch.utils.data.BatchSampler):
    """Drop the first ``skip`` records of a sampler and yield the rest.

    Wrap the repeated sampler (skip outside repeat), or the skip is applied at every epoch.
    Prefer ``SkipBatchSampler`` when resuming: progress is counted in batches, and records map
    to batches exactly only when every batch has the same size. The length is that of the
    wrapped sampler, since the skip is applied once to an endless, repeated stream.
    """

    def __init__(self, sampler: Iterable[Any], skip: int) -> None:
        _check_skip(skip)
        self._sampler = sampler
        self._skip = skip

    def __len__(self) -> int:
        return _sized_len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        return _skip_iter(self._sampler, self._skip)


class SkipBatchSampler(torch.utils.data.BatchSampler):
    """Drop the first ``skip`` batches of a batch sampler and yield the rest.

    Used to resume training where it stopped. The length is that of the wrapped sampler, since
    the skip is applied once to a repeated (endless) stream of batches.
    """

    def __init__(self, batch_sampler: Iterable[Any], skip: int) -> None:
        _check_skip(skip)
        self.batch_sampler = batch_sampler
        self.skip = skip
        self.length = _sized_len(batch_sampler)

    def __len__(self) -> int:
        return _sized_len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        return _skip_iter(self.batch_sampler, self.skip)


def _shuffled(source: Iterable[Any], rng: np.random.RandomState) -> Iterator[Any]:
    """Materialise one pass of ``source`` and return it in an order drawn from ``rng``."""
    items = list(source)
    rng.shuffle(items)
    return iter(items)


class ReproducibleShuffleSampler(torch.utils.data.Sampler):
    """Shuffle a sampler's records in an order fixed by ``seed``.

    Each pass draws a new order from the same seeded generator, so epoch ``k`` is the same in
    every run. Wrap a finite sampler: shuffle before repeating and skipping.
    """

    def __init__(self, sampler: Iterable[Any], seed: int) -> None:
        self._sampler = sampler
        self._rng = np.random.RandomState(seed)

    def __iter__(self) -> Iterator[Any]:
        return _shuffled(self._sampler, self._rng)

    def __len__(self) -> int:
        return _sized_len(self._sampler)


class ReproducibleShuffleBatchSampler(torch.utils.data.Sampler):
    """Shuffle the order of a batch sampler's batches in an order fixed by ``seed``.

    Batch contents stay as the wrapped sampler made them; prefer ``ReproducibleShuffleSampler``
    when possible. Shuffle before skipping and before repeating.
    """

    def __init__(self, batch_sampler: Iterable[Any], seed: int) -> None:
        self._batch_sampler = batch_sampler
        self._rng = np.random.RandomState(seed)

    def __iter__(self) -> Iterator[Any]:
        return _shuffled(self._batch_sampler, self._rng)

    def __len__(self) -> int:
        return _sized_len(self._batch_sampler)
