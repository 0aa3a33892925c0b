"""Determined's Core API (`det.core.init()` scripts) under `--launcher ray`, on the two-node
test cluster (marker `ray`): the Slurm module's three behaviours (`test_slurm_core_api`), with
the trials placed by Ray: an adaptive_asha search stops trials through `should_preempt()`, a
paused trial continues from `latest_checkpoint` to the uninterrupted run's weights, and two
processes, one on each node (`ray.slots_per_node: 1`), store sharded checkpoints and train as
the local two-process run does."""

from __future__ import annotations

import pathlib

import pytest

from tests._ray_cluster import (  # noqa: F401 - fixture
    RayCluster,
    ray_cluster_fixture,
)
from tests.test_ray import _live_actors
from tests.test_slurm import _job, _trial
from tests.test_slurm_core_api import (
    asha_stops_trials_through_should_preempt,
    paused_then_continued,
    two_processes_store_shards,
)

pytestmark = pytest.mark.ray


def on_ray(folder: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """`run const.yaml --launcher ray` of a Core API folder into `workspace` (`extra`: the
    cluster's `--address`)."""
    config = str(folder / "const.yaml")
    return ["run", config, "--launcher", "ray", "--workspace", str(workspace), *extra]


def test_an_adaptive_asha_search_on_ray_stops_trials_through_should_preempt(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    asha_stops_trials_through_should_preempt(tmp_path, on_ray, "--address", ray_cluster.address)
    assert not _live_actors(ray_cluster, "lb-1-")


def test_a_paused_trial_on_ray_continues_from_its_latest_checkpoint_to_the_same_weights(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    paused_then_continued(tmp_path, on_ray, "--address", ray_cluster.address)
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
