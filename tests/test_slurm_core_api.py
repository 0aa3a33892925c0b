"""Determined's Core API (`det.core.init()` scripts) under `--launcher slurm`, on the two-node
test cluster (marker `slurm`): an adaptive_asha search stops trials through
`should_preempt()`, a paused trial checkpoints at its next boundary and continues from
`latest_checkpoint` to the uninterrupted run's weights, and two processes across the two
nodes store sharded checkpoints and train as the local two-process run does.

The script is `CORE_TRAIN` (`_core_api_runs`), as `test_core_api_run` runs it locally; each
run here is compared with the same folder run by the local launcher.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_bridge.record._registry import Registry
from tests import _folders as sf
from tests._core_api_runs import core_folder, seen_runs
from tests._slurm_cluster import (
    SlurmCluster,
    slurm_cluster_fixture,  # noqa: F401 - fixture
)
from tests.test_slurm import _job, _seen, _shown, _trial, finish, lb, lb_start

pytestmark = pytest.mark.slurm

Run = Callable[..., list[str]]  # `run CONFIG` on a launcher into a workspace, more options

# ASHA over four learning rates, one trial at a time (its promotions then do not depend on
# which trial reports first): 16 batches at most, a rung at 4.
ASHA = {
    "hyperparameters": {
        "lr": {"type": "categorical", "vals": [0.001, 0.01, 0.05, 0.08]},
        "steps": 16,
    },
    "searcher": {
        "name": "adaptive_asha",
        "metric": "val_loss",
        "time_metric": "batches",
        "max_time": 16,
        "max_trials": 4,
        "max_concurrent_trials": 1,
        "mode": "aggressive",
        "max_rungs": 2,
        "divisor": 4,
    },
    # Draws 0.08 first, then only smaller rates (worse at the rung): ASHA promotes the first
    # trial and stops the others. A random seed could draw better rates one after another,
    # and ASHA would rightly promote every trial.
    "reproducibility": {"experiment_seed": 3},
}

TWO_PROCESSES = {
    "entrypoint": "python3 -m determined.launch.torch_distributed python3 train.py",
    "resources": {"slots_per_trial": 2},
}


def on_slurm(folder: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """`run const.yaml --launcher slurm` of a Core API folder into `workspace`."""
    config = str(folder / "const.yaml")
    return ["run", config, "--launcher", "slurm", "--workspace", str(workspace), *extra]


def on_local(folder: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """The same run on the local launcher: the reference."""
    config = str(folder / "const.yaml")
    return ["run", config, "--launcher", "local", "--workspace", str(workspace), *extra]


def trial_dir(workspace: pathlib.Path, trial: int = 1) -> pathlib.Path:
    return workspace / "experiments" / "1" / "trials" / str(trial)


def described(workspace: pathlib.Path, cwd: pathlib.Path) -> dict[str, Any]:
    done = lb("experiment", "describe", "1", "--json", "--workspace", str(workspace), cwd=cwd)
    assert done.returncode == 0, _shown(done)
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def run_to_end(args: list[str], cwd: pathlib.Path) -> None:
    done = lb(*args, cwd=cwd, timeout=500)
    assert done.returncode == 0, _shown(done)


# ----- the three behaviours, for either cluster's launcher -----


def asha_stops_trials_through_should_preempt(tmp_path: pathlib.Path, run: Run, *extra: str) -> None:
    """Every trial COMPLETED; a trial ASHA stops sees should_preempt() after its checkpoint
    at the first rung (4 batches) and exits; the promoted ones train to max_time (16)."""
    folder = core_folder(tmp_path, **ASHA)
    ws = tmp_path / "ws"
    run_to_end(run(folder, ws, *extra), tmp_path)
    trials = described(ws, tmp_path)["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}, trials
    stopped = {}
    for t in trials:
        (seen,) = seen_runs(trial_dir(ws, t["id"]))
        stopped[t["id"]] = seen["preempted_at"]
        last = seen["trained"][-1]
        assert [m["batches"] for m in t["validation"]] == list(range(4, last + 1, 4)), t
    assert stopped == {1: 16, 2: 4, 3: 4, 4: 4}, stopped  # the first trial's rate is the best


def uninterrupted_local_run(root: pathlib.Path) -> pathlib.Path:
    """The plain Core API folder run to its end locally in `root`; its workspace."""
    plain = root / "ws-plain"
    run_to_end(on_local(core_folder(root, "plain"), plain), root)
    return plain


def paused_then_continued(
    tmp_path: pathlib.Path, run: Run, *extra: str, plain: pathlib.Path | None = None
) -> dict[str, Any]:
    """A trial held before its 6th batch is paused: it checkpoints at its next boundary (8)
    and is recorded STOPPED; continued, it restores that checkpoint (`latest_checkpoint`),
    trains batches 9-12 and ends with the uninterrupted local run's weights and validations
    (`plain`: that run's workspace, where the caller has it already). The trial as
    `experiment describe` shows it at the end."""
    if plain is None:
        plain = uninterrupted_local_run(tmp_path)
    (uninterrupted,) = seen_runs(trial_dir(plain))

    gate = sf.Gate.at(tmp_path / "gate")
    folder = core_folder(tmp_path, "paused", hyperparameters=gate.hparams(5))
    ws = tmp_path / "ws"
    coordinator = lb_start(*run(folder, ws, *extra), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _seen(ws))
        paused = lb("experiment", "pause", "1", "--workspace", str(ws), cwd=tmp_path)
        assert paused.returncode == 0, _shown(paused)
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    first = described(ws, tmp_path)["trials"][0]
    assert first["state"] == "STOPPED", first
    (stopped,) = seen_runs(trial_dir(ws))
    assert stopped["preempted_at"] == 8 and stopped["trained"] == list(range(1, 9)), stopped

    gate.release()
    continued = lb("experiment", "continue", "1", "--workspace", str(ws), cwd=tmp_path)
    assert continued.returncode == 0, _shown(continued)
    trial: dict[str, Any] = described(ws, tmp_path)["trials"][0]
    assert trial["state"] == "COMPLETED", trial
    _, resumed = seen_runs(trial_dir(ws))
    assert resumed["latest"] is not None and resumed["trained"] == [9, 10, 11, 12], resumed
    assert resumed["restored_files"] == ["metadata.json", "shard.0", "state.pt"]
    assert resumed["weights"] == uninterrupted["weights"]
    plain_trial = described(plain, tmp_path)["trials"][0]
    assert [m["values"] for m in trial["validation"]] == [
        m["values"] for m in plain_trial["validation"]
    ]
    return trial


def two_processes_store_shards(
    tmp_path: pathlib.Path, run: Run, section: dict[str, Any], *extra: str
) -> None:
    """Two processes, one on each node (`section`: the launcher's config section): every
    checkpoint holds both ranks' shards and their merged metadata, and both ranks end with
    the weights of the same folder's local two-process run."""
    folder = core_folder(tmp_path, **TWO_PROCESSES, **section)
    weights = {}
    for name, how in (("local", on_local), ("cluster", run)):
        ws = tmp_path / f"ws-{name}"
        run_to_end(how(folder, ws, *extra), tmp_path)
        data = described(ws, tmp_path)
        (trial,) = data["trials"]
        assert trial["state"] == "COMPLETED", trial
        assert [m["batches"] for m in trial["validation"]] == [4, 8, 12], trial
        (rank0,) = seen_runs(trial_dir(ws), 0)
        (rank1,) = seen_runs(trial_dir(ws), 1)
        assert rank0["weights"] == rank1["weights"]
        weights[name] = rank0["weights"]
        (kept,) = data["checkpoints"]
        where = pathlib.Path(kept["location"])
        assert sorted(p.name for p in where.iterdir()) == [
            "metadata.json",
            "shard.0",
            "shard.1",
            "state.pt",
        ]
        assert json.loads((where / "metadata.json").read_text()) == {
            "steps_completed": 12,
            "rank_0": 0,
            "rank_1": 1,
        }
        assert (where / "shard.1").read_text() == "12"
        with Registry(ws) as registry:
            latest = registry.latest_checkpoint(1)
        assert latest is not None
        assert torch.load(pathlib.Path(latest.location) / "state.pt")["steps"] == 12
    assert weights["cluster"] == weights["local"]


# ----- on the Slurm test cluster -----


def test_an_adaptive_asha_search_of_jobs_stops_trials_through_should_preempt(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    asha_stops_trials_through_should_preempt(tmp_path, on_slurm)
    assert not slurm_cluster.jobs(under=tmp_path)


def test_a_paused_job_continues_from_its_latest_checkpoint_to_the_same_weights(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    paused_then_continued(tmp_path, on_slurm)
    ws = tmp_path / "ws"
    assert _trial(ws).runs == 2 and _job(ws).launcher == "slurm", _job(ws)
    assert not slurm_cluster.jobs(under=tmp_path)


def test_two_processes_across_the_nodes_store_sharded_checkpoints(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    two_processes_store_shards(tmp_path, on_slurm, {"slurm": {"slots_per_node": 1}})
    # A job across the two nodes, one task per process (`srun`); each task ran the script
    # once, as its rank (`two_processes_store_shards` finds one run of each).
    ws = tmp_path / "ws-cluster"
    assert "exec srun" in (trial_dir(ws) / "job.sh").read_text()
    assert _job(ws).state == "COMPLETED", _job(ws)
