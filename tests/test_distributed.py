"""Two CPU processes (gloo) train like one process with the same global batch size."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lightning_bridge as pytorch
from tests._trials import LinearTrial, fit

# Every test here starts two or three processes: a minute or more each on two cores.
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(
    tmp_path: pathlib.Path,
    name: str,
    agg: int,
    launcher: str,
    fail: str = "",
    trial: str = "one_model",
) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BRIDGE_TEST_TRIAL": trial}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    script = [str(REPO / "tests" / "_dist_script.py"), str(tmp_path / name), str(agg), launcher]
    if fail:
        script.append(fail)
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        cmd += script
    else:
        cmd = [sys.executable, *script]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def _load(tmp_path: pathlib.Path, name: str, rank: int) -> dict[str, Any]:
    return json.loads((tmp_path / f"{name}.{rank}.json").read_text())


Trained = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """`trained(agg, launcher, trial="one_model")`: each rank's results of the script's run,
    which must succeed; made once per module for each set of arguments, since several tests
    compare with the same one-process (or two-process) run."""
    runs: dict[tuple[int, str, str], list[dict[str, Any]]] = {}

    def run(agg: int, launcher: str, trial: str = "one_model") -> list[dict[str, Any]]:
        key = (agg, launcher, trial)
        if key not in runs:
            folder = tmp_path_factory.mktemp(f"{launcher}-{agg}-{trial}")
            done = _run(folder, "run", agg, launcher, trial=trial)
            assert done.returncode == 0, done.stdout + done.stderr
            ranks = 1 if launcher == "single" else 2
            runs[key] = [_load(folder, "run", r) for r in range(ranks)]
        return runs[key]

    return run


@pytest.mark.parametrize("agg", [1, 2])
@pytest.mark.parametrize("launcher", ["torchrun", "lightning"])
def test_two_processes_match_one(trained: Trained, agg: int, launcher: str) -> None:
    (one,) = trained(agg, "single")
    ranks = trained(agg, launcher)
    assert [r["size"] for r in ranks] == [2, 2] and one["size"] == 1
    # The trial's __init__ runs once every process is started, as in Determined: each rank
    # sees its own rank, the world size, its local rank and the node's.
    assert [r["seen_at_init"] for r in ranks] == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]]
    assert one["seen_at_init"] == [0, 1, 0, 1, 0, 1]
    for rank in ranks:
        # Float sums over two shards of 4 instead of one batch of 8: equal up to rounding.
        np.testing.assert_allclose(rank["weight"], one["weight"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rank["bias"], one["bias"], rtol=1e-5, atol=1e-6)
        assert [n for n, _ in rank["calls"]] == [n for n, _ in one["calls"]]
        for (_, got), (_, want) in zip(rank["calls"], one["calls"], strict=True):
            if want is not None:
                assert got[1] == want[1]  # batches in the window
                for key, value in want[0].items():
                    assert got[0][key] == pytest.approx(value, rel=1e-5)
        for got, want in zip(rank["val"], one["val"], strict=True):
            assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)
    assert ranks[0]["weight"] == ranks[1]["weight"]


def test_two_models_stepped_separately_train_like_one_process(trained: Trained) -> None:
    # Lightning's DDP wraps the whole TrialModule where Determined wraps each model: each of
    # the two backward passes leaves the other model's parameters without gradients.
    (one,) = trained(1, "single", "two_models")
    assert one["follower"], "the two-model trial ran"
    for rank in trained(1, "lightning", "two_models"):
        assert rank["size"] == 2
        for key in ("weight", "bias"):
            np.testing.assert_allclose(rank[key], one[key], rtol=1e-5, atol=1e-6)
        for got, want in zip(rank["follower"], one["follower"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for got, want in zip(rank["val"], one["val"], strict=True):
            assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)


@pytest.mark.parametrize("launcher", ["torchrun", "lightning"])
def test_a_failing_rank_stops_every_rank(tmp_path: pathlib.Path, launcher: str) -> None:
    start = time.monotonic()
    result = _run(tmp_path, "fail", 1, launcher, fail="1")
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 60 + 20  # 60 s promised, plus interpreter and Lightning start-up
    assert "deliberate failure on rank 1" in result.stdout + result.stderr
    assert not list(tmp_path.glob("fail.*.json")), "no rank finished training"


@pytest.mark.parametrize(
    ("strategy", "message"),
    [("fsdp", "only available on GPU"), ("deepspeed", "DeepSpeed installed")],
)
def test_other_strategies_are_handed_to_lightning_by_name(strategy: str, message: str) -> None:
    # On this CPU-only test machine Lightning refuses FSDP (GPU only) and DeepSpeed (not
    # installed) with its own messages: the name reached Lightning's strategy registry.
    with pytest.raises(Exception, match=message):
        fit(
            LinearTrial,
            init_kwargs={"accelerator": "cpu", "devices": 2, "strategy": strategy},
            max_length=pytorch.Batch(2),
        )


def _agent(tmp_path: pathlib.Path, out: str, torchrun: list[str]) -> subprocess.Popen[str]:
    """One torchrun agent (`torchrun` its options) running the script in a folder of its own,
    as on a machine of its own; its results in `out`.RANK.json."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "BRIDGE_TEST_TRIAL": "one_model"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    folder = tmp_path / f"{out}-{len(list(tmp_path.glob(out + '-*')))}"
    folder.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun]
    cmd += [str(REPO / "tests" / "_dist_script.py"), str(tmp_path / out), "1", "torchrun"]
    return subprocess.Popen(
        cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.processes
def test_two_torchrun_agents_on_a_c10d_rendezvous_train_like_one_agent(
    tmp_path: pathlib.Path, trained: Trained
) -> None:
    """A Trainer-API script across two machines (two agents, one process each, meeting at a
    c10d rendezvous on 127.0.0.1) ends with the weights and metrics of the same script's two
    processes under one agent (`torchrun --standalone --nproc-per-node 2`: the module's run
    that test_two_processes_match_one compares with one process too)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    rendezvous = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    rendezvous += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bridge-test"]
    agents = [_agent(tmp_path, "nodes", rendezvous) for _ in (0, 1)]
    outputs = [agent.communicate(timeout=240)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(outputs)
    nodes = [_load(tmp_path, "nodes", r) for r in (0, 1)]
    want = trained(1, "torchrun")
    # Each process sees its global rank, the world, its local rank on its own machine (0 of
    # 1) and its machine's rank among the two (Determined's cross rank / size).
    assert [r["seen_at_init"] for r in nodes] == [[0, 2, 0, 1, 0, 2], [1, 2, 0, 1, 1, 2]]
    assert [r["seen_at_init"] for r in want] == [[0, 2, 0, 2, 0, 1], [1, 2, 1, 2, 0, 1]]
    for got, same in zip(nodes, want, strict=True):
        assert got["size"] == 2
        assert (got["weight"], got["bias"]) == (same["weight"], same["bias"])
        assert got["calls"] == same["calls"] and got["val"] == same["val"]
    # The chief's machine holds the checkpoints; the other's none.
    chief, other = (tmp_path / f"nodes-{i}" / "checkpoints" for i in (0, 1))
    if not (chief.exists() and any(chief.iterdir())):  # which agent's process is rank 0
        chief, other = other, chief
    assert any(p.name != "latest" for p in chief.iterdir())
    assert not other.exists() or not any(other.iterdir())
