"""Determined's Core API (`det.core.init()` scripts) under `--launcher ray`, on the two-node
test cluster (marker `ray`): the Slurm module's three behaviours (`test_slurm_core_api`), with
the trials placed by Ray: an adaptive_asha search stops trials through `should_preempt()`, a
paused trial continues from `latest_checkpoint` to the uninterrupted run's weights, and two
processes, one on each node (`ray.slots_per_node: 1`), store sharded checkpoints and train as
the local two-process run does. A node being drained (`ray drain-node`) preempts its trial:
`should_preempt()` turns true, and the trial continues on the other node."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from tests import _folders as sf
from tests._core_api_runs import core_folder, seen_runs
from tests._ray_cluster import RayCluster, _ray, head_held
from tests.test_ray import _live_actors
from tests.test_slurm import _job, _seen, _trial, finish, lb_start
from tests.test_slurm_core_api import (
    asha_stops_trials_through_should_preempt,
    paused_then_continued,
    trial_dir,
    two_processes_store_shards,
    uninterrupted_local_run,
)

pytestmark = pytest.mark.ray


def on_ray(folder: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """`run const.yaml --launcher ray` of a Core API folder into `workspace` (`extra`: the
    cluster's `--address`)."""
    config = str(folder / "const.yaml")
    return ["run", config, "--launcher", "ray", "--workspace", str(workspace), *extra]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The plain Core API folder's uninterrupted local run, once for the module: the
    workspace the paused and the drained trial compare with."""
    return uninterrupted_local_run(tmp_path_factory.mktemp("plain"))


def test_an_adaptive_asha_search_on_ray_stops_trials_through_should_preempt(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    asha_stops_trials_through_should_preempt(tmp_path, on_ray, "--address", ray_cluster.address)
    assert not _live_actors(ray_cluster, "lb-1-")


def test_a_paused_trial_on_ray_continues_from_its_latest_checkpoint_to_the_same_weights(
    tmp_path: pathlib.Path, ray_cluster: RayCluster, plain: pathlib.Path
) -> None:
    paused_then_continued(tmp_path, on_ray, "--address", ray_cluster.address, plain=plain)
    ws = tmp_path / "ws"
    assert _trial(ws).runs == 2 and _job(ws).launcher == "ray", _job(ws)
    assert not _live_actors(ray_cluster, "lb-1-")


def test_two_processes_across_the_nodes_on_ray_store_sharded_checkpoints(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    section = {"ray": {"slots_per_node": 1}}
    two_processes_store_shards(tmp_path, on_ray, section, "--address", ray_cluster.address)
    ids = ray_cluster.node_ids()
    reason = _job(tmp_path / "ws-cluster").reason
    assert ids["head"][:12] in reason and ids["worker"][:12] in reason, reason


def test_a_drained_node_preempts_the_script_which_continues_on_the_other_node(
    tmp_path: pathlib.Path, spare_ray_cluster: RayCluster, plain: pathlib.Path
) -> None:
    """The script runs on the worker node (the head's CPUs held while it is placed), held
    before its 6th batch; the worker is drained (`ray drain-node`, reason preemption):
    `should_preempt()` turns true, the script checkpoints at its next boundary (8) and exits,
    and the launcher places it on the head, where it continues from that checkpoint to the
    uninterrupted local run's weights."""
    (uninterrupted,) = seen_runs(trial_dir(plain))

    cluster = spare_ray_cluster
    with head_held(cluster) as release_head:
        gate = sf.Gate.at(tmp_path / "gate")
        folder = core_folder(tmp_path, "drained", hyperparameters=gate.hparams(5))
        ws = tmp_path / "ws"
        coordinator = lb_start(*on_ray(folder, ws, "--address", cluster.address), cwd=tmp_path)
        try:
            gate.wait(seen=lambda: _seen(ws))
            worker = cluster.node_ids()["worker"]
            assert worker[:12] in _job(ws).reason, _job(ws)
            release_head()
            drain = [
                _ray(), "drain-node", "--address", cluster.address, "--node-id", worker,
                "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot reclaim",
                "--deadline-remaining-seconds", "600",
            ]  # fmt: skip
            drained = subprocess.run(
                drain,
                env={**os.environ, **cluster.env},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert drained.returncode == 0, drained.stdout + drained.stderr
        finally:
            out = finish(coordinator, timeout=300)
    assert coordinator.returncode == 0, out[-4000:]
    assert f"its node {worker[:12]} is being drained" in out, out[-4000:]
    job = _job(ws)
    assert job.state == "COMPLETED" and job.restarts == 1, job
    assert cluster.node_ids()["head"][:12] in job.reason, job
    trial = _trial(ws)
    assert trial.state == "COMPLETED" and trial.batches_trained == 12, trial
    first, resumed = seen_runs(trial_dir(ws))
    assert first["preempted_at"] == 8 and first["trained"] == list(range(1, 9)), first
    assert resumed["trained"] == [9, 10, 11, 12], resumed
    assert resumed["weights"] == uninterrupted["weights"]
    # The drained node leaves: the next test sharing the cluster gets a new worker node.
    cluster.kill_worker()
