"""`--launcher ray`: trials placed on a real two-node Ray cluster started on this machine
(marker `ray`, the cluster of `_ray_cluster`), each run compared with the same trial or search
run locally (the local launcher, as a user runs it): same final weights, bit for bit.

The trial is the Slurm tests' linear trial (`SLOW_MODEL_DEF`: held at a batch by the test's
gate, `sf.Gate`, while the test pauses, kills or takes the cluster apart; its ranks' view of
the cluster written by its __init__), the search the tiny trial's adaptive_asha search.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import signal
import subprocess
import time
from typing import Any

import pytest
import torch

from lightning_bridge.record._registry import Registry
from lightning_bridge.record._workspace import Workspace
from tests import _folders as sf
from tests._folders import weights_by_hparams
from tests._ray_cluster import RayCluster, head_held
from tests._servers import free_port
from tests.test_slurm import (
    _config,
    _final_weights,
    _folder,
    _job,
    _same,
    _shown,
    _trial,
    _wait_for,
    finish,
    lb,
    lb_start,
)

pytestmark = pytest.mark.ray


def on_ray(config: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """`run CONFIG --launcher ray` on CPUs into `workspace` (`extra`: more options)."""
    return [
        "run",
        str(config),
        "--launcher",
        "ray",
        "--accelerator",
        "cpu",
        "--workspace",
        str(workspace),
        *extra,
    ]


def _experiments(workspace: pathlib.Path) -> list[Any]:
    if not Workspace(workspace).registry_path.exists():
        return []
    with Registry(workspace) as registry:
        return registry.experiments()


def _search_trials(workspace: pathlib.Path) -> list[Any]:
    """The workspace's trials (its record in its folder or on the server workspace.json
    names); none while it is being created."""
    try:
        with Registry(workspace) as registry:
            return registry.trials()
    except Exception:  # noqa: BLE001 - the registry being created
        return []


def _live_actors(cluster: RayCluster, prefix: str) -> list[str]:
    """The names of the cluster's live actors starting with `prefix`, as `ray list actors`
    shows them (Ray's state API, asked from this process: no `ray` command to start)."""
    from ray.util.state import list_actors

    return [
        str(actor.name)
        for actor in list_actors(address=cluster.dashboard_url, limit=500)
        if actor.state == "ALIVE" and str(actor.name or "").startswith(prefix)
    ]


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The linear trial's final weights run locally, once for the module."""
    root = tmp_path_factory.mktemp("local")
    config = _folder(root, _config())
    done = lb(*on_ray(config, root / "ws", "--launcher", "local"), cwd=root)
    assert done.returncode == 0, _shown(done)
    return _final_weights(root / "ws")


def _asha(gate: sf.Gate | None = None, batch: int = 0) -> dict[str, Any]:
    """The tiny trial's adaptive_asha search, one trial at a time: ASHA's promotions then do
    not depend on which of two trials reports first, so the search makes the same trials,
    each trained as long, on every run. `gate`: each trial held there at `batch`."""
    config = copy.deepcopy(sf.ASHA_CONFIG)
    config["searcher"]["max_concurrent_trials"] = 1
    if gate is not None:
        config["hyperparameters"].update(gate.hparams(batch))
    return config


GATED = ("gate", "hold_at")  # the hyperparameters of the gate, left out of the comparisons


@pytest.fixture(scope="module")
def local_search_weights(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, torch.Tensor]]:
    """The adaptive_asha search's trials' final weights run locally, by hyperparameters."""
    root = tmp_path_factory.mktemp("local-search")
    path = sf.write_folder(root, _asha(), "exp", sf.TINY)
    done = lb(*on_ray(path, root / "ws", "--launcher", "local"), cwd=root, timeout=400)
    assert done.returncode == 0, _shown(done)
    return weights_by_hparams(root / "ws", leave_out=GATED)


# ----- refusals, before anything is recorded -----


def test_a_dead_or_malformed_address_is_refused_before_anything_is_recorded(
    tmp_path: pathlib.Path,
) -> None:
    """No cluster at the address (a GCS address, a Ray Client address, RAY_ADDRESS), or no
    address at all: exit 2 within seconds, one line naming the address and the fix, and the
    workspace records nothing."""
    path = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    dead = f"127.0.0.1:{free_port()}"
    client = f"ray://127.0.0.1:{free_port()}"
    for extra, env in (
        (("--address", dead), {}),
        (("--address", client), {}),
        ((), {"RAY_ADDRESS": dead}),
        (("--address", "127.0.0.1:port"), {}),
    ):
        started = time.monotonic()
        done = subprocess.run(
            sf.command(*on_ray(path, ws, *extra)),
            cwd=tmp_path,
            env={**sf.cli_env(), **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, _shown(done)
        assert time.monotonic() - started < 60
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        shown = extra[1] if extra else dead
        assert shown in lines[0] and "--address" in lines[0], lines[0]
        assert "lightning-bridge: error:" in lines[0]
        assert not _experiments(ws)


def test_a_bad_ray_section_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    """The config's `ray` section is checked before the cluster is reached: a bad value, an
    unknown key, processes that do not split over their nodes."""
    cases = (
        ({"ray": {"slots_per_node": "two"}}, "ray.slots_per_node: expected a positive integer"),
        ({"ray": {"cpus": 2}}, "ray.cpus: not a key of the ray section"),
        ({"ray": {"runtime_env": ["pip"]}}, "ray.runtime_env: expected a mapping"),
        (
            {"ray": {"slots_per_node": 2}, "resources": {"slots_per_trial": 3}},
            "3 processes do not split evenly",
        ),
    )
    for number, (changes, message) in enumerate(cases):
        path = _folder(tmp_path, _config(**changes), name=f"exp{number}")
        ws = tmp_path / f"ws{number}"
        done = lb(*on_ray(path, ws, "--address", f"127.0.0.1:{free_port()}"), cwd=tmp_path)
        assert done.returncode == 2, _shown(done)
        assert message in done.stderr, done.stderr
        assert not _experiments(ws)


def test_refusals_that_need_the_cluster(tmp_path: pathlib.Path, ray_cluster: RayCluster) -> None:
    """A resource pool no node declares, a trial larger than any node: refused with the
    cluster's view, nothing recorded."""
    cases = (
        ({"resources": {"resource_pool": "absent"}}, "custom resource 'absent'"),
        (
            {"resources": {"slots_per_trial": 4}, "ray": {"slots_per_node": 4}},
            "the trial needs 1 node(s) with 4 CPUs each",
        ),
        (
            {"resources": {"slots_per_trial": 2, "max_slots": 1}},
            "resources.max_slots: 1 slots, fewer than one trial's 2",
        ),
    )
    for number, (changes, message) in enumerate(cases):
        path = _folder(tmp_path, _config(**changes), name=f"exp{number}")
        ws = tmp_path / f"ws{number}"
        done = lb(*on_ray(path, ws, "--address", ray_cluster.address), cwd=tmp_path)
        assert done.returncode == 2, _shown(done)
        assert message in done.stderr, done.stderr
        assert not _experiments(ws)


# ----- trials -----


def test_a_trial_through_ray_client_in_its_pool_has_the_local_weights(
    tmp_path: pathlib.Path, ray_cluster: RayCluster, local_weights: dict[str, torch.Tensor]
) -> None:
    """Through Ray Client (`ray://`), with `resources.resource_pool` naming the worker's
    custom resource: the trial runs on the worker node, `experiment describe` names the node
    and the actor, `trial logs` shows its output, its weights are the local run's."""
    path = _folder(tmp_path, _config(resources={"resource_pool": "node-b"}))
    ws = tmp_path / "ws"
    done = lb(*on_ray(path, ws, "--address", ray_cluster.client_address), cwd=tmp_path)
    assert done.returncode == 0, _shown(done)
    worker = ray_cluster.node_ids()["worker"]
    job = _job(ws)
    assert job.launcher == "ray" and job.state == "COMPLETED", job
    assert f"node {worker[:12]}" in job.reason and "Ray actor lb-1-1-" in job.reason, job
    assert _trial(ws).state == "COMPLETED"
    _same(_final_weights(ws), local_weights)
    described = lb("experiment", "describe", "1", "--workspace", str(ws), cwd=tmp_path)
    assert re.search(r"Ray actor lb-1-1-\w+ on node", described.stdout), described.stdout
    assert worker[:12] in described.stdout
    logs = lb("trial", "logs", "1", "--workspace", str(ws), cwd=tmp_path)
    assert logs.returncode == 0 and "Start-up:" in logs.stdout, _shown(logs)


def test_a_trial_across_the_two_nodes_equals_its_two_process_local_run(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """`slots_per_trial: 2` with `ray.slots_per_node: 1`: one process on each node (a
    placement group, STRICT_SPREAD), the rendezvous at rank 0's node; the ranks see their
    node ranks, both nodes' addresses and `ray.runtime_env`'s variables, and the weights and
    validations equal the local two-process run's."""
    runtime_env = {"env_vars": {"FROM_HOOK": "from ray.runtime_env"}}
    config = _config(
        resources={"slots_per_trial": 2}, ray={"slots_per_node": 1, "runtime_env": runtime_env}
    )
    path = _folder(tmp_path, config)
    results: dict[str, Any] = {}
    for launcher in ("local", "ray"):
        ws = tmp_path / f"ws-{launcher}"
        extra = ("--launcher", "local", "--force") if launcher == "local" else ()
        env = {"RAY_ADDRESS": ray_cluster.address}
        done = lb(*on_ray(path, ws, *extra), cwd=tmp_path, env=env)
        assert done.returncode == 0, _shown(done)
        with Registry(ws) as registry:
            results[launcher] = [m.values for m in registry.metrics(1, "validation")]
        results[f"{launcher}-weights"] = _final_weights(ws)
        seen = [json.loads((path.parent / f"init.{r}.json").read_text()) for r in (0, 1)]
        if launcher == "ray":
            job = _job(ws)
            ids = ray_cluster.node_ids()
            assert ids["head"][:12] in job.reason and ids["worker"][:12] in job.reason, job
            # each rank: its rank and the trial's size, one process on its node, its node's
            # rank (cross rank) of two, and the trial's two node addresses
            assert [s[:4] for s in seen] == [[0, 2, 0, 1], [1, 2, 0, 1]], seen
            assert [s[4:7] for s in seen] == [[0, 2, 0], [1, 2, 1]], seen
            assert all(len(s[7]) == 2 for s in seen), seen
            # `ray.runtime_env` reached both nodes' processes
            assert [s[8] for s in seen] == ["from ray.runtime_env"] * 2, seen
            assert (ws / "experiments/1/trials/1/output.node1.log").is_file()
    _same(results["local-weights"], results["ray-weights"])
    assert results["local"] == results["ray"]


def test_a_script_across_the_two_nodes_equals_its_two_process_local_run(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """A Trainer-API script (`python3 train.py`) across the two nodes: torchrun on each node,
    its rendezvous at rank 0's node; the two ranks see a world of two and the weights equal
    the local two-process run's (one torchrun of both)."""
    config = copy.deepcopy(sf.BASE_CONFIG)
    config.update(
        entrypoint="python3 train.py",
        hyperparameters={"global_batch_size": 8, "lr": 0.05},
        resources={"slots_per_trial": 2},
        ray={"slots_per_node": 1},
    )
    path = sf.write_folder(tmp_path, config)
    weights = {}
    for launcher in ("local", "ray"):
        ws = tmp_path / f"ws-{launcher}"
        extra = ("--launcher", "local", "--force") if launcher == "local" else ()
        done = lb(*on_ray(path, ws, *extra, "--address", ray_cluster.address), cwd=tmp_path)
        assert done.returncode == 0, _shown(done)
        seen = [json.loads((path.parent / f"script.{r}.json").read_text()) for r in (0, 1)]
        # a world of two; the chief holds the checkpoints, the last at batch 6
        assert [s["size"] for s in seen] == [2, 2] and seen[0]["batches"] == 6, seen
        weights[launcher] = _final_weights(ws)
    assert _job(tmp_path / "ws-ray").state == "COMPLETED"
    _same(weights["local"], weights["ray"])


def test_an_adaptive_asha_search_forks_its_trials_warm_with_the_local_weights(
    tmp_path: pathlib.Path,
    ray_cluster: RayCluster,
    local_search_weights: dict[str, dict[str, torch.Tensor]],
) -> None:
    """The search's trials are placed on both nodes and forked there from each node's warm
    process (well under a second from the process's start to training); every trial ends
    with the weights of the same trial of the local search."""
    path = sf.write_folder(tmp_path, _asha(), "exp", sf.TINY)
    ws = tmp_path / "ws"
    done = lb(*on_ray(path, ws, "--address", ray_cluster.address), cwd=tmp_path, timeout=400)
    assert done.returncode == 0, _shown(done)
    weights = weights_by_hparams(ws, leave_out=GATED)
    assert weights.keys() == local_search_weights.keys()
    for key, expected in local_search_weights.items():
        _same(weights[key], expected)
    with Registry(ws) as registry:
        jobs = registry.jobs(1)
    assert {j.launcher for j in jobs} == {"ray"} and all(j.state == "COMPLETED" for j in jobs)
    startups = []
    for trial_dir in sorted((ws / "experiments/1/trials").iterdir()):
        found = re.findall(r"Start-up: ([0-9.]+) s", (trial_dir / "trial.log").read_text())
        startups += [float(s) for s in found]
    assert len(startups) == 4 and sorted(startups)[1] < 1.0, startups
    assert not _live_actors(ray_cluster, "lb-1-")


def test_pause_then_continue_on_ray_to_the_same_weights(
    tmp_path: pathlib.Path, ray_cluster: RayCluster, local_weights: dict[str, torch.Tensor]
) -> None:
    """`experiment pause` while the trial trains: it checkpoints and stops, the coordinator
    ends; `experiment continue` places it again and it ends with the uninterrupted weights."""
    path = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    gate = sf.Gate.at(tmp_path / "gate")
    held = (*gate.options(6), "--address", ray_cluster.address)
    coordinator = lb_start(*on_ray(path, ws, *held), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _search_trials(ws))
        paused = lb("experiment", "pause", "1", "--workspace", str(ws), cwd=tmp_path)
        assert paused.returncode == 0, _shown(paused)
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    trial = _trial(ws)
    assert trial.state == "STOPPED" and 6 <= trial.batches_trained < 24, trial
    assert not _live_actors(ray_cluster, "lb-1-")
    gate.release()
    done = lb("experiment", "continue", "1", "--workspace", str(ws), cwd=tmp_path)
    assert done.returncode == 0, _shown(done)
    assert _trial(ws).state == "COMPLETED" and _trial(ws).runs == 2
    _same(_final_weights(ws), local_weights)


def test_experiment_kill_ends_a_search_on_ray(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """`experiment kill` ends the running trials at once (their actors and processes gone),
    records them stopped, and the coordinator ends. Every trial is held after 2 batches (of
    its first rung's 4) and never released: none can complete before the kill, and both of
    the search's concurrent trials are held when it comes."""
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(sf.ASHA_CONFIG)
    config["hyperparameters"].update(gate.hparams(2))
    path = sf.write_folder(tmp_path, config, "exp", sf.TINY)
    ws = tmp_path / "ws"
    coordinator = lb_start(*on_ray(path, ws, "--address", ray_cluster.address), cwd=tmp_path)
    try:
        gate.wait(2, seen=lambda: _search_trials(ws))
        killed = lb("experiment", "kill", "1", "--workspace", str(ws), cwd=tmp_path)
        assert killed.returncode == 0, _shown(killed)
    finally:
        out = finish(coordinator)
    trials = _search_trials(ws)
    assert trials and not any(t.state == "ACTIVE" for t in trials), trials
    assert not any(t.state == "COMPLETED" for t in trials), trials
    _wait_for(lambda: not _live_actors(ray_cluster, "lb-1-"), 30, "the trials' actors to end")
    assert "lightning-bridge: error" not in out.split("Search")[0] or coordinator.returncode == 0


@pytest.mark.postgres
def test_a_killed_coordinator_then_experiment_continue_finishes_the_search_on_postgresql(
    tmp_path: pathlib.Path,
    ray_cluster: RayCluster,
    postgres: Any,
    local_search_weights: dict[str, dict[str, torch.Tensor]],
) -> None:
    """The search's record and its Optuna storage on PostgreSQL, as a cluster shares them; its
    coordinator SIGKILLed mid-search: its trials' actors end with it; `experiment continue`
    goes on from the trials' checkpoints to the local search's weights."""
    gate = sf.Gate.at(tmp_path / "gate")
    path = sf.write_folder(tmp_path, _asha(gate, 3), "exp", sf.TINY)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "workspace.json").write_text(json.dumps({"record": postgres.new_database()}))
    held = ("--address", ray_cluster.address, "--storage", postgres.new_database())
    coordinator = lb_start(*on_ray(path, ws, *held), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _search_trials(ws))  # the first trial, after 3 batches
        coordinator.send_signal(signal.SIGKILL)
    finally:
        finish(coordinator)
    _wait_for(lambda: not _live_actors(ray_cluster, "lb-1-"), 60, "the trials' actors to end")
    gate.release()
    done = lb("experiment", "continue", "1", "--workspace", str(ws), cwd=tmp_path, timeout=400)
    assert done.returncode == 0, _shown(done)
    weights = weights_by_hparams(ws, leave_out=GATED)
    assert weights.keys() == local_search_weights.keys()
    for key, expected in local_search_weights.items():
        _same(weights[key], expected)


# ----- faults that take the cluster apart -----


def test_a_lost_node_trial_continues_on_the_other_node_to_the_same_weights(
    tmp_path: pathlib.Path,
    spare_ray_cluster: RayCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The trial runs on the worker node (the head's CPUs held by another job while it is
    placed); the worker's raylet is killed mid-trial: the trial is placed again on the head
    and continues from its latest checkpoint to the uninterrupted run's weights."""
    cluster = spare_ray_cluster
    with head_held(cluster) as release_head:
        path = _folder(tmp_path, _config())
        ws = tmp_path / "ws"
        gate = sf.Gate.at(tmp_path / "gate")
        held = (*gate.options(8), "--address", cluster.address)
        coordinator = lb_start(*on_ray(path, ws, *held), cwd=tmp_path)
        try:
            gate.wait(seen=lambda: _search_trials(ws))  # after 8 batches
            assert cluster.node_ids()["worker"][:12] in _job(ws).reason
            release_head()
            cluster.kill_worker()
            # Released: placed again on the head, the trial goes on from its latest checkpoint
            # (before the gate, or after it where the lost node's stop let it finish the batch).
            gate.release()
        finally:
            out = finish(coordinator, timeout=300)
    assert coordinator.returncode == 0, out[-4000:]
    assert "its node was lost" in out, out[-4000:]
    job = _job(ws)
    assert job.state == "COMPLETED" and job.restarts == 1, job
    assert cluster.node_ids()["head"][:12] in job.reason, job
    trial = _trial(ws)
    assert trial.state == "COMPLETED" and trial.batches_trained == 24, trial
    _same(_final_weights(ws), local_weights)


def test_the_cluster_going_away_stops_the_trial_with_one_message_and_loses_nothing(
    tmp_path: pathlib.Path,
    fresh_ray_cluster: RayCluster,
    ray_cluster: RayCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The whole cluster stops mid-trial: the coordinator ends (exit 1) with one error line
    naming the cluster and how to continue, the trial is recorded stopped with its
    checkpoints; continued on another cluster, it ends with the uninterrupted weights."""
    path = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    gate = sf.Gate.at(tmp_path / "gate")
    held = (*gate.options(4), "--address", fresh_ray_cluster.address)
    coordinator = lb_start(*on_ray(path, ws, *held), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _search_trials(ws))  # after 4 batches
        fresh_ray_cluster.crash()
        started = time.monotonic()
        out = finish(coordinator, timeout=120)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    assert coordinator.returncode == 1, out[-4000:]
    assert time.monotonic() - started < 60
    errors = [line for line in out.splitlines() if line.startswith("lightning-bridge: error:")]
    assert len(errors) == 1, out[-4000:]
    assert fresh_ray_cluster.address in errors[0] and "experiment continue 1" in errors[0]
    trial = _trial(ws)
    assert trial.state == "STOPPED" and 4 <= trial.batches_trained < 24, trial
    with Registry(ws) as registry:
        assert registry.latest_checkpoint(1) is not None
    again = ray_cluster.address  # another cluster: the session's
    gate.release()
    done = lb(
        "experiment", "continue", "1", "--workspace", str(ws), "--address", again, cwd=tmp_path
    )
    assert done.returncode == 0, _shown(done)
    assert _trial(ws).state == "COMPLETED"
    _same(_final_weights(ws), local_weights)
