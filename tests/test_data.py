"""Behaviour of the trial DataLoader and the batch helpers as a user observes it."""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from lightning_bridge import samplers
from lightning_bridge.contract._data import (
    DataLoader,
    adapt_batch_sampler,
    data_length,
    dataset_repro_message,
    is_trial_data_loader,
    to_device,
)


class _Indices(tud.Dataset):
    """Each record is its own index, so batches show the sampling order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class _Stream(tud.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def _ids(loader: Any, count: int | None = None) -> list[list[int]]:
    batches = loader if count is None else itertools.islice(loader, count)
    return [batch.tolist() for batch in batches]


def _shuffled_loader(seed: int = 123, n: int = 10, batch_size: int = 3) -> DataLoader:
    return DataLoader(
        _Indices(n),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )


# --- DataLoader outside a trainer -------------------------------------------------------------


def test_iterates_like_a_torch_loader() -> None:
    loader = DataLoader(_Indices(7), batch_size=3)
    assert _ids(loader) == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(loader) == 3
    expected = _ids(tud.DataLoader(_Indices(7), batch_size=3))
    assert _ids(loader) == expected


def test_drop_last_drops_the_partial_batch() -> None:
    loader = DataLoader(_Indices(7), batch_size=3, drop_last=True)
    assert _ids(loader) == [[0, 1, 2], [3, 4, 5]]
    assert len(loader) == 2


def test_exposes_the_loading_configuration() -> None:
    dataset = _Indices(4)
    loader = DataLoader(dataset, batch_size=2, num_workers=1)
    assert loader.dataset is dataset
    assert loader.batch_size == 2
    assert loader.drop_last is False
    assert isinstance(loader.sampler, tud.SequentialSampler)
    assert isinstance(loader.batch_sampler, tud.BatchSampler)
    assert loader.collate_fn is tud.default_collate
    assert loader.prefetch_factor == 2
    assert loader.num_workers == 1


def test_custom_batch_sampler_is_used_as_given() -> None:
    batch_sampler = [[3, 1], [0], [2, 2]]
    loader = DataLoader(_Indices(4), batch_sampler=batch_sampler)
    assert loader.batch_size is None
    assert loader.batch_sampler is batch_sampler
    assert _ids(loader) == [[3, 1], [0], [2, 2]]


def test_custom_collate_fn_is_applied() -> None:
    loader = DataLoader(_Indices(4), batch_size=2, collate_fn=lambda xs: sum(xs))
    assert list(loader) == [1, 5]


def test_worker_processes_load_the_same_batches() -> None:
    loader = DataLoader(_Indices(9), batch_size=2, num_workers=2)
    assert _ids(loader) == _ids(DataLoader(_Indices(9), batch_size=2))


def test_shuffle_is_reproducible_with_a_seeded_generator() -> None:
    first = _ids(_shuffled_loader(seed=5))
    assert first == _ids(_shuffled_loader(seed=5))
    assert first != _ids(_shuffled_loader(seed=6))
    assert sorted(i for batch in first for i in batch) == list(range(10))


# --- get_data_loader: repeat, shard, skip -----------------------------------------------------


def test_get_data_loader_default_is_one_epoch() -> None:
    torch_loader = DataLoader(_Indices(5), batch_size=2).get_data_loader()
    assert isinstance(torch_loader, tud.DataLoader)
    assert _ids(torch_loader) == [[0, 1], [2, 3], [4]]
    assert len(torch_loader) == 3


def test_repeat_continues_past_the_epoch_and_reshuffles() -> None:
    torch_loader = _shuffled_loader(n=6, batch_size=2).get_data_loader(repeat=True)
    assert len(torch_loader) == 3
    batches = _ids(torch_loader, 9)
    epochs = [sorted(i for b in batches[e : e + 3] for i in b) for e in (0, 3, 6)]
    assert epochs == [list(range(6))] * 3
    assert batches[0:3] != batches[3:6] or batches[3:6] != batches[6:9]


@pytest.mark.parametrize("skip", [1, 3, 7, 11])
def test_skip_after_repeat_continues_the_uninterrupted_order(skip: int) -> None:
    uninterrupted = _ids(_shuffled_loader().get_data_loader(repeat=True), 16)
    resumed = _ids(_shuffled_loader().get_data_loader(repeat=True, skip=skip), 16 - skip)
    assert resumed == uninterrupted[skip:]


def test_skip_without_repeat_yields_the_rest_of_the_epoch() -> None:
    torch_loader = DataLoader(_Indices(7), batch_size=2).get_data_loader(skip=2)
    assert _ids(torch_loader) == [[4, 5], [6]]


@pytest.mark.parametrize("total", [6, 7, 8])
def test_two_ranks_cover_the_global_batches_without_overlap(total: int) -> None:
    global_batches = _ids(DataLoader(_Indices(total), batch_size=2))
    shards = [
        _ids(DataLoader(_Indices(total), batch_size=2).get_data_loader(num_replicas=2, rank=r))
        for r in range(2)
    ]
    assert shards[0] == global_batches[0::2]
    assert shards[1] == global_batches[1::2]
    assert sorted(shards[0] + shards[1]) == sorted(global_batches)
    lengths = [
        len(DataLoader(_Indices(total), batch_size=2).get_data_loader(num_replicas=2, rank=r))
        for r in range(2)
    ]
    assert lengths == [len(s) for s in shards]


def test_sharded_shuffled_ranks_see_disjoint_parts_of_the_same_order() -> None:
    global_batches = _ids(_shuffled_loader().get_data_loader(repeat=True), 12)
    for rank in range(2):
        shard = _ids(_shuffled_loader().get_data_loader(repeat=True, num_replicas=2, rank=rank), 6)
        assert shard == global_batches[rank::2]


def test_skip_counts_the_batches_of_this_rank() -> None:
    def rank1(skip: int) -> tud.DataLoader:
        return _shuffled_loader().get_data_loader(repeat=True, skip=skip, num_replicas=2, rank=1)

    uninterrupted = _ids(rank1(0), 10)
    assert _ids(rank1(4), 6) == uninterrupted[4:]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0}, "num_replicas must be at least 1"),
        ({"num_replicas": 2, "rank": 2}, "rank must be in"),
        ({"rank": -1}, "rank must be in"),
        ({"skip": -3}, "skip must be non-negative"),
    ],
)
def test_get_data_loader_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(_Indices(4)).get_data_loader(**kwargs)


def test_adapt_batch_sampler_wraps_repeat_then_shard_then_skip() -> None:
    base = tud.BatchSampler(tud.SequentialSampler(range(4)), 1, False)
    adapted = adapt_batch_sampler(base, repeat=True, skip=2, num_replicas=2, rank=0)
    assert isinstance(adapted, samplers.SkipBatchSampler)
    sharded = adapted.batch_sampler
    assert isinstance(sharded, samplers.DistributedBatchSampler)
    assert isinstance(sharded.batch_sampler, samplers.RepeatBatchSampler)
    assert list(itertools.islice(adapted, 3)) == [[0], [2], [0]]
    assert adapt_batch_sampler(base) is base


# --- constructor checks -----------------------------------------------------------------------


def test_iterable_dataset_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError) as info:
        DataLoader(_Stream())
    text = str(info.value)
    assert "IterableDataset" in text
    assert "torch.utils.data.DataLoader" in text
    assert "context.experimental.disable_dataset_reproducibility_checks()" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": None}, "batch_size=None"),
        ({"num_workers": -1}, "num_workers must be non-negative"),
        ({"timeout": -1}, "timeout must be non-negative"),
        ({"prefetch_factor": 2}, "prefetch_factor only applies"),
        ({"num_workers": 1, "prefetch_factor": -1}, "prefetch_factor must be non-negative"),
        ({"persistent_workers": True}, "persistent_workers=True needs"),
        ({"shuffle": True, "sampler": [0, 1]}, "mutually exclusive"),
        ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler is mutually exclusive"),
        ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler is mutually exclusive"),
        ({"batch_sampler": [[0]], "shuffle": True}, "batch_sampler is mutually exclusive"),
    ],
)
def test_constructor_rejects_conflicting_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(_Indices(4), **kwargs)


# --- data_length ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch",
    [
        torch.zeros(5, 2),
        np.zeros((5, 3)),
        {"x": torch.zeros(5, 2), "y": torch.zeros(5)},
        [torch.zeros(5), torch.zeros(5, 9)],
        (np.zeros(5), torch.zeros(5)),
        {"inputs": [torch.zeros(5, 4), torch.zeros(5)], "target": torch.zeros(5)},
        {"text": ["a", "b", "c", "d", "e"], "label": torch.zeros(5)},
        [["a", "b", "c", "d", "e"], ["p", "q", "r", "s", "t"]],
    ],
)
def test_data_length_is_the_batch_size(batch: Any) -> None:
    assert data_length(batch) == 5


@pytest.mark.parametrize("empty", [{}, [], ()])
def test_data_length_of_an_empty_container_is_an_error(empty: Any) -> None:
    with pytest.raises(ValueError, match="empty"):
        data_length(empty)


@pytest.mark.parametrize("bad", [3, "abc", None, object()])
def test_data_length_of_an_unsupported_type_is_an_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="get_batch_length"):
        data_length(bad)


def test_data_length_of_a_scalar_tensor_is_an_error() -> None:
    with pytest.raises(ValueError, match="0-dimensional"):
        data_length(torch.tensor(1.0))
    with pytest.raises(TypeError, match="no length"):
        data_length([1, 2])


# --- to_device --------------------------------------------------------------------------------


_Pair = collections.namedtuple("_Pair", ["a", "b"])


class _Movable:
    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: Any) -> _Movable:
        self.moved_to = device
        return self


def test_to_device_moves_nested_structures() -> None:
    movable = _Movable()
    batch = {
        "x": torch.ones(2),
        "pair": _Pair(np.arange(3), [torch.zeros(1), (np.ones(2, dtype=np.float32),)]),
        "custom": movable,
    }
    moved = to_device(batch, torch.device("meta"))
    assert moved["x"].device.type == "meta"
    assert isinstance(moved["pair"], _Pair)
    assert isinstance(moved["pair"].a, torch.Tensor) and moved["pair"].a.device.type == "meta"
    inner = moved["pair"].b
    assert isinstance(inner, list) and inner[0].device.type == "meta"
    assert isinstance(inner[1], tuple)
    assert inner[1][0].dtype == torch.float32 and inner[1][0].device.type == "meta"
    assert moved["custom"] is movable and movable.moved_to == torch.device("meta")


def test_to_device_converts_numeric_arrays_to_tensors() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    moved = to_device(array, "cpu")
    assert isinstance(moved, torch.Tensor)
    assert moved.dtype == torch.int16
    assert moved.tolist() == array.tolist()


def test_to_device_warns_once_per_unmovable_type(caplog: pytest.LogCaptureFixture) -> None:
    strings = np.array(["a", "b"])
    batch = ["label", "other", strings, 3, torch.ones(1)]
    with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
        moved = to_device(batch, "cpu")
    assert moved[:2] == ["label", "other"]
    assert moved[2] is strings and moved[3] == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "lightning_bridge"]
    assert len(warnings) == 3
    assert sum("'str'" in w for w in warnings) == 1
    assert sum("'ndarray'" in w for w in warnings) == 1
    assert sum("'int'" in w for w in warnings) == 1


def test_to_device_shared_warned_types_silences_repeats(caplog: pytest.LogCaptureFixture) -> None:
    warned: set[type] = set()
    with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
        to_device("a", "cpu", warned)
        to_device(["b"], "cpu", warned)
    assert len([r for r in caplog.records if r.name == "lightning_bridge"]) == 1
    assert warned == {str}


# --- checks on what a trial returns -----------------------------------------------------------


def test_repro_message_names_the_return_and_the_ways_forward() -> None:
    text = dataset_repro_message("build_training_data_loader", tud.DataLoader(_Indices(2)))
    assert text.startswith("build_training_data_loader()")
    assert "torch.utils.data.dataloader.DataLoader" in text
    assert "lightning_bridge.DataLoader" in text
    assert "drop-in" in text
    assert "context.experimental.disable_dataset_reproducibility_checks()" in text
    assert "returned None" in dataset_repro_message("build_validation_data_loader", None)


class _DeterminedLike:
    """Shaped like determined.pytorch.DataLoader without importing it."""

    def __init__(self) -> None:
        self.batch_sampler = [[0]]

    def get_data_loader(self, repeat: bool = False) -> None:
        return None


def test_is_trial_data_loader() -> None:
    assert is_trial_data_loader(DataLoader(_Indices(2)))
    assert is_trial_data_loader(_DeterminedLike())
    assert not is_trial_data_loader(tud.DataLoader(_Indices(2)))
    assert not is_trial_data_loader(DataLoader)
    assert not is_trial_data_loader(_DeterminedLike)
    assert not is_trial_data_loader(None)
    assert not is_trial_data_loader([[0]])
