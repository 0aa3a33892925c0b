"""The two-node Ray test cluster of `_ray_cluster` (marker `ray`): what the Ray launcher's tests
rely on. Both nodes alive with the resources naming them, work placed on each node by its
resource, clients finding the cluster by `env` and by `client_address`, and a worker node
lost and replaced (on the spare cluster the tests that lose a worker share).

A driver in this process attaches to the head node (Ray prefers the head when several nodes
share the machine), so losing the worker never takes the test process with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests._ray_cluster import CPUS_PER_NODE, RESOURCES, RayCluster

pytestmark = pytest.mark.ray

# Run by a client in a subprocess: the node id of a task placed on the worker node, by the
# worker's resource (the address from RAY_ADDRESS when no argument is given).
NODE_OF_A_TASK = """
import sys
import ray

ray.init(*sys.argv[1:])
node = ray.remote(lambda: ray.get_runtime_context().get_node_id())
print(ray.get(node.options(resources={"node-b": 1}).remote(), timeout=60))
ray.shutdown()
"""


@pytest.fixture
def connect() -> Iterator[Any]:
    """`ray.init` on a cluster's address, `ray.shutdown` after the test; yields ray."""
    import ray

    def init(cluster: RayCluster) -> Any:
        ray.init(address=cluster.address, log_to_driver=False)
        return ray

    yield init
    ray.shutdown()


def node_of(ray: Any, resource: str) -> str:
    """The id of the node a task asking for one unit of `resource` ran on."""
    node = ray.remote(lambda: ray.get_runtime_context().get_node_id())
    return str(ray.get(node.options(resources={resource: 1}).remote(), timeout=60))


def alive(ray: Any) -> dict[str, dict[str, float]]:
    """The alive nodes' total resources, by node id, as the driver sees them."""
    return {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}


def test_both_nodes_are_alive_with_the_resources_naming_them(
    ray_cluster: RayCluster, connect: Any
) -> None:
    ray = connect(ray_cluster)
    ids = ray_cluster.node_ids()
    assert set(ids) == {"head", "worker"}
    nodes = alive(ray)
    assert set(nodes) == set(ids.values())
    for name, node_id in ids.items():
        assert nodes[node_id]["CPU"] == CPUS_PER_NODE
        assert nodes[node_id][RESOURCES[name]] == 100
        other = RESOURCES["worker" if name == "head" else "head"]
        assert other not in nodes[node_id]
    total = ray.cluster_resources()
    assert total["CPU"] == 2 * CPUS_PER_NODE
    assert (total["node-a"], total["node-b"]) == (100, 100)


def test_a_task_placed_by_a_node_resource_runs_on_that_node(
    ray_cluster: RayCluster, connect: Any
) -> None:
    ray = connect(ray_cluster)
    ids = ray_cluster.node_ids()
    assert node_of(ray, "node-a") == ids["head"]
    assert node_of(ray, "node-b") == ids["worker"]
    assert ids["head"] != ids["worker"]


def test_clients_find_the_cluster_by_env_and_by_client_address(
    ray_cluster: RayCluster,
) -> None:
    worker = ray_cluster.node_ids()["worker"]
    by_env = subprocess.run(
        [sys.executable, "-c", NODE_OF_A_TASK],
        env={**_environ(), **ray_cluster.env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr[-3000:]
    assert by_env.stdout.split()[-1] == worker
    by_client = subprocess.run(
        [sys.executable, "-c", NODE_OF_A_TASK, ray_cluster.client_address],
        env=_environ(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    logs = sorted(ray_cluster.ray_logs("head").glob("ray_client_server*"))
    assert by_client.returncode == 0, by_client.stderr[-3000:] + "".join(
        f"\n--- {log}:\n{log.read_text()[-3000:]}" for log in logs
    )
    assert by_client.stdout.split()[-1] == worker


def test_a_lost_worker_node_is_dead_and_a_new_one_takes_its_place(
    spare_ray_cluster: RayCluster, connect: Any
) -> None:
    cluster = spare_ray_cluster
    ray = connect(cluster)
    before = cluster.node_ids()
    assert node_of(ray, "node-b") == before["worker"]

    start = time.monotonic()
    cluster.kill_worker()
    assert time.monotonic() - start < 15  # the head's health check, tuned to ~3 s
    assert cluster.node_ids() == {"head": before["head"]}
    assert set(alive(ray)) == {before["head"]}
    assert cluster.past_nodes[-1].processes() == []  # the whole node is gone
    # Nothing offers node-b now: a task asking for it waits.
    waiting = ray.remote(lambda: 1).options(resources={"node-b": 1}).remote()
    ready, _ = ray.wait([waiting], timeout=2)
    assert ready == []

    cluster.start_worker()
    after = cluster.node_ids()
    assert after["head"] == before["head"]
    assert after["worker"] != before["worker"]
    assert set(alive(ray)) == set(after.values())
    assert ray.get(waiting, timeout=60) == 1  # the waiting task ran on the new node
    assert node_of(ray, "node-b") == after["worker"]


def _environ() -> dict[str, str]:
    """This process's environment without a Ray address of its own."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
