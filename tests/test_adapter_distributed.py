"""A ported LightningModule on two gloo CPU processes trains like one process.

The module (tests/_adapter_dist_script.py: automatic optimization, SGD with momentum, a
step-interval StepLR, a torchmetrics accuracy and `sync_dist` values logged in
`validation_step`, no dropout) is trained for 2 epochs with a global batch of 32, once in one
process and once in two processes (per-process batch 16). The two-process run gets a
DistributedSampler on both loaders. Without shuffling it interleaves the records: rank 0
trains on ids 0, 2, 4, ... and rank 1 on 1, 3, 5, ..., so at every step the two per-process
batches of 16 together are the one-process batch of 32 (checked below). The training set has
112 records, so the last batch of each epoch is smaller (16 = 8 + 8). DDP averages the two
per-process mean gradients, which is the mean gradient over the union, so the weights and
the validation metrics match the one-process run up to float rounding.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from lightning_bridge.adapter._module_data import distributed_loader
from tests import _adapter_dist_script as script
from tests._adapter_modules import max_weight_diff

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "_adapter_dist_script.py"
VAL_KEYS = ("val_loss", "val_acc", "val_count", "val_local_count")


def _run(out: pathlib.Path, mode: str, shuffle: bool) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(out.parent / "xdg")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    args = [str(SCRIPT), str(out), mode, "shuffle" if shuffle else "sequential"]
    if mode == "torchrun":
        args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    result = subprocess.run(
        [sys.executable, *args],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = 1 if mode == "single" else 2
    return [json.loads(out.with_name(f"{out.name}.{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """One process, and two processes started by Lightning's launcher (`init(devices=2)`)."""
    folder = tmp_path_factory.mktemp("adapter_ddp")
    return {
        "single": _run(folder / "single", "single", shuffle=False),
        "ddp": _run(folder / "ddp", "lightning", shuffle=False),
    }


@pytest.mark.slow
def test_two_processes_train_like_one(runs: dict[str, list[dict[str, Any]]]) -> None:
    (one,), ranks = runs["single"], runs["ddp"]
    assert (one["size"], one["per_slot_batch"]) == (1, 32)
    assert [(r["rank"], r["size"], r["per_slot_batch"]) for r in ranks] == [(0, 2, 16), (1, 2, 16)]
    # The sampler interleaves without shuffling: each step's two batches of 16 are, together,
    # the one-process batch of 32 (the last step of an epoch: 8 + 8 = 16).
    for epoch in ("0", "1"):
        seen = [r["seen"][epoch] for r in ranks]
        assert seen[0] == list(range(0, script.N_TRAIN, 2))
        assert seen[1] == list(range(1, script.N_TRAIN, 2))
        assert one["seen"][epoch] == list(range(script.N_TRAIN))
        for step in range(4):
            half = [s[step * 16 : (step + 1) * 16] for s in seen]
            assert sorted(half[0] + half[1]) == one["seen"][epoch][step * 32 : (step + 1) * 32]
    # Same weights on both ranks, and the weights of the one-process run.
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert max_weight_diff(ranks[0]["weights"], one["weights"]) < 1e-5
    # StepLR stepped once per optimizer step: 8 steps, step_size 3 -> lr 0.2 * 0.5**2.
    assert [r["lr"] for r in ranks] == [pytest.approx(one["lr"])] * 2
    assert one["lr"] == pytest.approx(0.05)
    # The reported validation metrics are the one-process ones, after each epoch.
    for rank in ranks:
        assert len(rank["val"]) == len(one["val"]) == script.EPOCHS
        for got, want in zip(rank["val"], one["val"], strict=True):
            for key in VAL_KEYS:
                assert got[key] == pytest.approx(want[key], rel=1e-5), key


@pytest.mark.slow
def test_validation_covers_the_whole_set(runs: dict[str, list[dict[str, Any]]]) -> None:
    (one,), ranks = runs["single"], runs["ddp"]
    for rank in ranks:
        for reported, want, module_saw in zip(
            rank["val"], one["val"], rank["callback_metrics"], strict=True
        ):
            # Reported: every record counted once, accuracy over all of them.
            assert reported["val_count"] == script.N_VAL
            assert reported["val_local_count"] == script.N_VAL
            assert reported["val_acc"] == pytest.approx(want["val_acc"], rel=1e-6)
            # What the module reads in self.trainer.callback_metrics on each rank:
            # sync_dist=True values are summed over processes; the others are this
            # process's own (25 of the 50 records), as in Lightning's DDP.
            assert module_saw["val_count"] == script.N_VAL
            assert module_saw["val_local_count"] == script.N_VAL / 2
            assert module_saw["val_loss"] == pytest.approx(reported["val_loss"], rel=1e-6)
            # torchmetrics syncs its state across processes in compute().
            assert module_saw["val_acc"] == pytest.approx(want["val_acc"], rel=1e-6)
    assert one["callback_metrics"][-1]["val_local_count"] == script.N_VAL
    # The accuracy is a real one (not a constant), and it changed with training.
    assert 0.3 < one["val"][0]["val_acc"] < 1.0
    assert one["val"][0]["val_acc"] != one["val"][1]["val_acc"]


@pytest.mark.slow
def test_shuffled_training_data_is_split_between_processes(tmp_path: pathlib.Path) -> None:
    """With `shuffle=True` (torchrun) each epoch's records are split, disjoint, between ranks."""
    ranks = _run(tmp_path / "shuffled", "torchrun", shuffle=True)
    orders = []
    for epoch in (0, 1):
        seen = [r["seen"][str(epoch)] for r in ranks]
        assert len(seen[0]) == len(seen[1]) == script.N_TRAIN // 2
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(script.N_TRAIN))
        # The order of Lightning's DDP sampler: DistributedSampler(shuffle=True, seed=0),
        # a new permutation each epoch.
        for rank, ids in enumerate(seen):
            sampler = DistributedSampler(range(script.N_TRAIN), 2, rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            assert ids == list(sampler)
        orders.append(seen[0])
    assert orders[0] != orders[1]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert [v["val_count"] for v in ranks[0]["val"]] == [script.N_VAL] * script.EPOCHS


class _EveryThirdReversed(Sampler[int]):
    """A custom sampler: the records 0, 3, 6, ... in reverse order."""

    def __init__(self, n: int) -> None:
        self.ids = list(range(n))[::3][::-1]

    def __iter__(self) -> Any:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def _ids(loader: Any) -> list[int]:
    return [int(i) for (ids,) in loader for i in ids]


def test_a_custom_sampler_is_split_not_replaced() -> None:
    data = TensorDataset(torch.arange(30))
    loader = DataLoader(data, batch_size=4, sampler=_EveryThirdReversed(30))
    ranks = [_ids(distributed_loader(loader, r, 2, shuffle=True)) for r in (0, 1)]
    # Each process takes every other record of the sampler's own order.
    assert ranks == [[27, 21, 15, 9, 3], [24, 18, 12, 6, 0]]


def test_a_shuffled_loader_follows_seed_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    data = TensorDataset(torch.arange(20))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # what lightning.seed_everything(7) sets
    got = _ids(distributed_loader(loader, 1, 2, shuffle=True))
    assert got == list(DistributedSampler(range(20), 2, 1, shuffle=True, seed=7))
    assert got != list(DistributedSampler(range(20), 2, 1, shuffle=True, seed=0))
