"""Sampling parity with ``determined.pytorch``: same batches, same lengths, same RNG draws."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

det_pytorch = pytest.importorskip("determined.pytorch")
det_samplers = pytest.importorskip("determined.pytorch.samplers")

from lightning_bridge import samplers as bridge_samplers  # noqa: E402
from lightning_bridge.contract import _data as bridge_data  # noqa: E402

pytestmark = pytest.mark.interop

_TAKE = 23  # more than two epochs of every finite sampler below


class _Indices(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class _RandomPerRecord(tud.Dataset):
    """Records drawn from torch's RNG: exposes how worker processes are seeded."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, 1_000_000, (1,))


def _head(iterable: Iterable[Any], count: int = _TAKE) -> list[Any]:
    return [
        item.tolist() if isinstance(item, torch.Tensor) else item
        for item in itertools.islice(iterable, count)
    ]


def _batch_sampler(n: int, batch_size: int, drop_last: bool = False) -> tud.BatchSampler:
    return tud.BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)


def _assert_same(build: Callable[[Any], Any], finite: bool = True) -> None:
    """Build with each module; compare lengths and the first items of two passes."""
    ours, theirs = build(bridge_samplers), build(det_samplers)
    if finite:
        assert len(ours) == len(theirs)
    assert _head(ours) == _head(theirs)
    assert _head(ours) == _head(theirs)


@pytest.mark.parametrize("n", [1, 7, 10])
def test_repeat(n: int) -> None:
    _assert_same(lambda m: m.RepeatSampler(tud.SequentialSampler(range(n))))
    _assert_same(lambda m: m.RepeatBatchSampler(_batch_sampler(n, 3)))


@pytest.mark.parametrize(("num_workers", "rank"), [(1, 0), (2, 0), (2, 1), (3, 2), (4, 3)])
@pytest.mark.parametrize("n", [0, 5, 10])
def test_shard(n: int, num_workers: int, rank: int) -> None:
    _assert_same(lambda m: m.DistributedSampler(tud.SequentialSampler(range(n)), num_workers, rank))
    _assert_same(lambda m: m.DistributedBatchSampler(_batch_sampler(n, 2), num_workers, rank))


@pytest.mark.parametrize("skip", [0, 1, 4, 20])
def test_skip(skip: int) -> None:
    _assert_same(lambda m: m.SkipSampler(tud.SequentialSampler(range(9)), skip))
    _assert_same(lambda m: m.SkipBatchSampler(_batch_sampler(9, 2), skip))


@pytest.mark.parametrize("seed", [0, 1, 777, 2**31 - 1])
def test_shuffle(seed: int) -> None:
    _assert_same(lambda m: m.ReproducibleShuffleSampler(tud.SequentialSampler(range(13)), seed))
    _assert_same(lambda m: m.ReproducibleShuffleBatchSampler(_batch_sampler(13, 3), seed))


@pytest.mark.parametrize(("skip", "num_workers", "rank"), [(0, 1, 0), (5, 2, 1), (9, 3, 0)])
def test_full_chains(skip: int, num_workers: int, rank: int) -> None:
    def records(m: Any) -> Any:
        shuffled = m.ReproducibleShuffleSampler(tud.SequentialSampler(range(11)), 3)
        sharded = m.DistributedSampler(m.RepeatSampler(shuffled), num_workers, rank)
        return m.SkipSampler(sharded, skip)

    def batches(m: Any) -> Any:
        shuffled = m.ReproducibleShuffleBatchSampler(_batch_sampler(11, 2), 3)
        sharded = m.DistributedBatchSampler(m.RepeatBatchSampler(shuffled), num_workers, rank)
        return m.SkipBatchSampler(sharded, skip)

    _assert_same(records)
    _assert_same(batches)


@pytest.mark.parametrize(
    ("num_workers", "rank"), [(0, 0), (2, -1), (2, 2)], ids=["no-workers", "neg-rank", "rank-hi"]
)
def test_same_sharding_arguments_are_refused(num_workers: int, rank: int) -> None:
    for module in (bridge_samplers, det_samplers):
        with pytest.raises(ValueError):
            module.DistributedBatchSampler(_batch_sampler(4, 1), num_workers, rank)


# --- DataLoader.get_data_loader ---------------------------------------------------------------

_COMBOS = [
    (False, 0, 1, 0),
    (True, 0, 1, 0),
    (True, 7, 1, 0),
    (False, 2, 1, 0),
    (False, 0, 2, 1),
    (True, 0, 2, 0),
    (True, 3, 2, 1),
    (True, 10, 3, 2),
    (False, 1, 3, 0),
]


def _loader_kwargs(kind: str) -> dict[str, Any]:
    if kind == "sequential":
        return {"batch_size": 3}
    if kind == "shuffle-generator":
        return {"batch_size": 3, "shuffle": True, "generator": torch.Generator().manual_seed(11)}
    if kind == "shuffle-global":
        return {"batch_size": 3, "shuffle": True}
    if kind == "drop-last":
        return {"batch_size": 4, "shuffle": True, "drop_last": True}
    raise AssertionError(kind)


def _run_loader(module: Any, kind: str, combo: tuple[bool, int, int, int]) -> dict[str, Any]:
    """Seed torch, build the loader through ``module``, draw batches, record RNG state after."""
    repeat, skip, num_replicas, rank = combo
    torch.manual_seed(2024)
    kwargs = _loader_kwargs(kind)
    loader = module.DataLoader(_Indices(14), **kwargs)
    torch_loader = loader.get_data_loader(
        repeat=repeat, skip=skip, num_replicas=num_replicas, rank=rank
    )
    result: dict[str, Any] = {
        "len": len(torch_loader),
        "outer_len": len(loader),
        "batches": _head(torch_loader),
        "second_pass": _head(torch_loader, 5),
        "global_rng": torch.get_rng_state(),
    }
    generator = kwargs.get("generator")
    if generator is not None:
        result["generator_rng"] = generator.get_state()
    return result


@pytest.mark.parametrize("kind", ["sequential", "shuffle-generator", "shuffle-global", "drop-last"])
@pytest.mark.parametrize("combo", _COMBOS, ids=lambda c: "r{}-s{}-n{}-k{}".format(*c))
def test_get_data_loader_matches(kind: str, combo: tuple[bool, int, int, int]) -> None:
    ours = _run_loader(bridge_data, kind, combo)
    theirs = _run_loader(det_pytorch, kind, combo)
    assert ours["len"] == theirs["len"]
    assert ours["outer_len"] == theirs["outer_len"]
    assert ours["batches"] == theirs["batches"]
    assert ours["second_pass"] == theirs["second_pass"]
    assert torch.equal(ours["global_rng"], theirs["global_rng"])
    if "generator_rng" in theirs:
        assert torch.equal(ours["generator_rng"], theirs["generator_rng"])


def test_direct_iteration_matches() -> None:
    results = []
    for module in (bridge_data, det_pytorch):
        torch.manual_seed(5)
        loader = module.DataLoader(_Indices(10), batch_size=4, shuffle=True)
        results.append(([b.tolist() for b in loader], len(loader), torch.get_rng_state()))
    assert results[0][:2] == results[1][:2]
    assert torch.equal(results[0][2], results[1][2])


def test_worker_seeding_matches() -> None:
    results = []
    for module in (bridge_data, det_pytorch):
        loader = module.DataLoader(
            _RandomPerRecord(),
            batch_size=2,
            num_workers=2,
            generator=torch.Generator().manual_seed(3),
        )
        results.append(_head(loader.get_data_loader(repeat=True, skip=1, num_replicas=2), 4))
    assert results[0] == results[1]


def test_loader_attributes_match() -> None:
    cases: list[dict[str, Any]] = [
        {"batch_size": 2},
        {"batch_size": 3, "num_workers": 2, "drop_last": True},
    ]
    for kwargs in cases:
        ours = bridge_data.DataLoader(_Indices(5), **kwargs)
        theirs = det_pytorch.DataLoader(_Indices(5), **kwargs)
        for name in ("batch_size", "drop_last", "num_workers", "prefetch_factor", "timeout"):
            assert getattr(ours, name) == getattr(theirs, name), name
        assert ours.collate_fn is theirs.collate_fn
        assert type(ours.sampler) is type(theirs.sampler)
        assert type(ours.batch_sampler) is type(theirs.batch_sampler)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": None},
        {"num_workers": -1},
        {"timeout": -1},
        {"prefetch_factor": 2},
        {"persistent_workers": True},
        {"shuffle": True, "sampler": [0, 1]},
        {"batch_sampler": [[0]], "batch_size": 2},
        {"batch_sampler": [[0]], "drop_last": True},
    ],
)
def test_same_constructor_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    for module in (bridge_data, det_pytorch):
        with pytest.raises(ValueError):
            module.DataLoader(_Indices(4), **kwargs)


# --- helpers ----------------------------------------------------------------------------------

_BATCHES = [
    torch.zeros(4, 2),
    np.zeros((6, 1)),
    {"x": torch.zeros(3), "y": np.zeros(3)},
    [torch.zeros(2), torch.zeros(2)],
    (np.zeros(5), torch.zeros(5)),
]


@pytest.mark.parametrize("batch", _BATCHES)
def test_data_length_matches(batch: Any) -> None:
    assert bridge_data.data_length(batch) == det_pytorch.data_length(batch)


def test_to_device_matches() -> None:
    batch = {"x": np.arange(3), "y": [torch.ones(2), (np.ones(1, dtype=np.float32), "tag")]}
    ours = bridge_data.to_device(batch, torch.device("cpu"))
    theirs = det_pytorch.to_device(batch, torch.device("cpu"))
    assert type(ours["x"]) is type(theirs["x"]) and torch.equal(ours["x"], theirs["x"])
    assert ours["x"].dtype == theirs["x"].dtype
    assert torch.equal(ours["y"][0], theirs["y"][0])
    assert type(ours["y"][1]) is type(theirs["y"][1])
    assert torch.equal(ours["y"][1][0], theirs["y"][1][0])
    assert ours["y"][1][1] == theirs["y"][1][1]


def test_determined_loader_counts_as_a_trial_loader() -> None:
    assert bridge_data.is_trial_data_loader(det_pytorch.DataLoader(_Indices(3)))
