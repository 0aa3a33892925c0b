"""Behaviour of the reproducible samplers as a user chaining them observes it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import torch.utils.data as tud

from lightning_bridge import samplers


def _batches(n: int, batch_size: int, drop_last: bool = False) -> tud.BatchSampler:
    return tud.BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)


def _take(iterable: object, count: int) -> list:
    return list(itertools.islice(iterable, count))  # type: ignore[call-overload]


class _Unsized:
    """An iterable with no length."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


# --- repeat -----------------------------------------------------------------------------------


def test_repeat_sampler_cycles_and_reports_one_pass() -> None:
    sampler = samplers.RepeatSampler(tud.SequentialSampler(range(3)))
    assert len(sampler) == 3
    assert _take(sampler, 8) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_repeat_batch_sampler_cycles_batches() -> None:
    sampler = samplers.RepeatBatchSampler(_batches(5, 2))
    assert len(sampler) == 3
    assert _take(sampler, 5) == [[0, 1], [2, 3], [4], [0, 1], [2, 3]]


def test_repeat_reiterates_so_each_epoch_is_reshuffled() -> None:
    shuffled = samplers.ReproducibleShuffleBatchSampler(_batches(12, 3), seed=1)
    repeated = _take(samplers.RepeatBatchSampler(shuffled), 12)
    epochs = [repeated[i : i + 4] for i in range(0, 12, 4)]
    for epoch in epochs:
        assert sorted(epoch) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert len({tuple(map(tuple, e)) for e in epochs}) > 1


@pytest.mark.parametrize("cls", [samplers.RepeatSampler, samplers.RepeatBatchSampler])
def test_repeat_of_empty_sampler_raises_instead_of_hanging(cls: type) -> None:
    with pytest.raises(ValueError, match="yielded nothing"):
        next(iter(cls(_batches(1, 2, drop_last=True))))


def test_repeat_of_unsized_sampler_has_no_length() -> None:
    with pytest.raises(TypeError, match="no length"):
        len(samplers.RepeatSampler(_Unsized()))
    assert _take(samplers.RepeatSampler(_Unsized()), 4) == [0, 1, 2, 0]


# --- shard ------------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [0, 1, 6, 7, 8])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_distributed_batch_sampler_partitions_batches(total: int, num_workers: int) -> None:
    global_batches = list(_batches(total, 1))
    shards = [
        samplers.DistributedBatchSampler(_batches(total, 1), num_workers, rank)
        for rank in range(num_workers)
    ]
    seen = [list(shard) for shard in shards]
    for rank, (shard, got) in enumerate(zip(shards, seen, strict=True)):
        assert len(shard) == len(got)
        assert got == global_batches[rank::num_workers]
    flat = sorted(b[0] for got in seen for b in got)
    assert flat == list(range(total))


def test_distributed_sampler_deals_records_round_robin() -> None:
    rank0 = samplers.DistributedSampler(tud.SequentialSampler(range(7)), num_workers=2, rank=0)
    rank1 = samplers.DistributedSampler(tud.SequentialSampler(range(7)), num_workers=2, rank=1)
    assert list(rank0) == [0, 2, 4, 6] and len(rank0) == 4
    assert list(rank1) == [1, 3, 5] and len(rank1) == 3


def test_sharding_a_repeated_sampler_keeps_ranks_in_step() -> None:
    rank1 = samplers.DistributedBatchSampler(samplers.RepeatBatchSampler(_batches(3, 1)), 2, 1)
    assert _take(rank1, 4) == [[1], [0], [2], [1]]


@pytest.mark.parametrize(
    "cls", [samplers.DistributedSampler, samplers.DistributedBatchSampler], ids=["rec", "batch"]
)
@pytest.mark.parametrize(
    ("num_workers", "rank", "message"),
    [(2, -1, "non-negative"), (0, 0, "greater than zero"), (2, 2, "less than num_workers")],
)
def test_sharding_rejects_bad_rank_or_size(
    cls: type, num_workers: int, rank: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cls(_batches(4, 1), num_workers, rank)


# --- skip -------------------------------------------------------------------------------------


def test_skip_batch_sampler_drops_leading_batches_but_keeps_length() -> None:
    sampler = samplers.SkipBatchSampler(_batches(7, 2), skip=2)
    assert list(sampler) == [[4, 5], [6]]
    assert len(sampler) == 4
    assert sampler.skip == 2


def test_skip_sampler_drops_leading_records() -> None:
    sampler = samplers.SkipSampler(tud.SequentialSampler(range(5)), skip=3)
    assert list(sampler) == [3, 4]
    assert len(sampler) == 5


def test_skip_past_the_end_yields_nothing() -> None:
    assert list(samplers.SkipBatchSampler(_batches(4, 2), skip=5)) == []


@pytest.mark.parametrize("cls", [samplers.SkipSampler, samplers.SkipBatchSampler])
def test_skip_rejects_negative_counts(cls: type) -> None:
    with pytest.raises(ValueError, match="skip must be non-negative"):
        cls(_batches(4, 2), -1)


def test_skip_after_repeat_resumes_mid_stream() -> None:
    def stream() -> tud.BatchSampler:
        shuffled = samplers.ReproducibleShuffleBatchSampler(_batches(10, 3), seed=7)
        return samplers.RepeatBatchSampler(shuffled)

    uninterrupted = _take(stream(), 15)
    resumed = _take(samplers.SkipBatchSampler(stream(), 7), 8)
    assert resumed == uninterrupted[7:]


# --- shuffle ----------------------------------------------------------------------------------


def test_shuffle_sampler_is_reproducible_for_a_seed() -> None:
    def epochs(seed: int) -> list[list[int]]:
        sampler = samplers.ReproducibleShuffleSampler(tud.SequentialSampler(range(20)), seed)
        return [list(sampler) for _ in range(3)]

    first = epochs(3)
    assert first == epochs(3)
    assert first != epochs(4)
    for epoch in first:
        assert sorted(epoch) == list(range(20))
    assert first[0] != first[1]


def test_shuffle_sampler_follows_numpy_random_state_with_the_seed() -> None:
    expected = list(range(10))
    np.random.RandomState(42).shuffle(expected)
    sampler = samplers.ReproducibleShuffleSampler(tud.SequentialSampler(range(10)), 42)
    assert list(sampler) == expected
    assert len(sampler) == 10


def test_shuffle_batch_sampler_permutes_whole_batches() -> None:
    sampler = samplers.ReproducibleShuffleBatchSampler(_batches(9, 3), seed=0)
    again = samplers.ReproducibleShuffleBatchSampler(_batches(9, 3), seed=0)
    got = list(sampler)
    assert got == list(again)
    assert sorted(got) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(sampler) == 3


def test_record_level_chain_skip_outside_repeat_applies_once() -> None:
    def repeated() -> samplers.RepeatSampler:
        shuffled = samplers.ReproducibleShuffleSampler(tud.SequentialSampler(range(6)), 5)
        return samplers.RepeatSampler(shuffled)

    plain = _take(repeated(), 18)
    resumed = samplers.SkipSampler(repeated(), 4)
    assert _take(resumed, 14) == plain[4:]
    assert len(resumed) == 6


def test_skip_inside_repeat_drops_items_every_epoch() -> None:
    shuffled = samplers.ReproducibleShuffleSampler(tud.SequentialSampler(range(6)), 5)
    pitfall = samplers.RepeatSampler(samplers.SkipSampler(shuffled, 2))
    reference = samplers.ReproducibleShuffleSampler(tud.SequentialSampler(range(6)), 5)
    epochs = [list(reference) for _ in range(2)]
    assert _take(pitfall, 8) == epochs[0][2:] + epochs[1][2:]
