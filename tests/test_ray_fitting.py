"""`--launcher ray` without `ray.slots_per_node`: a trial's nodes found as Determined's agent
resource manager finds them (one node where one holds the trial; else the fewest nodes of one
size, each fully used). The rule itself needs no cluster; the runs use the two-node test
cluster of `_ray_cluster` (2 CPUs a node, marker `ray`) and compare with the local run.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from lightning_bridge.experiment.launch.ray._settings import fit_nodes
from tests._ray_cluster import CPUS_PER_NODE, RayCluster
from tests.test_ray import _experiments, on_ray
from tests.test_slurm import (
    SLOW_MODEL_DEF,
    _config,
    _final_weights,
    _folder,
    _job,
    _same,
    _shown,
    lb,
)

# The Slurm tests' linear trial with a validation set that leaves every one of 4 processes a
# batch (32 samples in batches of 16 leave two of them none).
_VALIDATION = "Data(32, 1), batch_size=16"
WIDE_MODEL_DEF = SLOW_MODEL_DEF.replace(_VALIDATION, "Data(64, 1), batch_size=16")
assert _VALIDATION in SLOW_MODEL_DEF


@pytest.mark.parametrize(
    ("slots", "sizes", "per_node"),
    [
        (2, [2, 2], 2),  # one node holds it
        (2, [1, 1], 1),  # two nodes of one slot
        (4, [2, 2], 2),
        (8, [4, 4, 2, 2, 2, 2], 4),  # the largest nodes first: the fewest nodes
        (6, [4, 4, 2, 2, 2], 2),  # 6 is no multiple of 4: three nodes of 2
        (16, [8, 4, 4, 4, 4], 4),  # one node of 8 is too few: four of 4
        (3, [2, 2], None),  # no multiple of the node size
        (6, [2, 2], None),  # too few nodes
        (12, [8, 8, 4], None),  # nodes of different sizes are not mixed
        (1, [], None),
    ],
)
def test_fit_nodes_places_a_trial_as_determined_does(
    slots: int, sizes: list[int], per_node: int | None
) -> None:
    assert fit_nodes(slots, sizes) == per_node


@pytest.mark.ray
def test_a_trial_larger_than_a_node_spans_whole_nodes_with_the_local_weights(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    """A config with no `ray` section whose `slots_per_trial` no node holds (twice a node's
    CPUs) runs unchanged on both nodes, each fully used, and ends with the local run's
    validations and weights; a size that splits into no whole nodes is refused naming the
    nodes' sizes, before anything is recorded."""
    slots = 2 * CPUS_PER_NODE
    path = _folder(tmp_path, _config(resources={"slots_per_trial": slots}))
    (path.parent / "model_def.py").write_text(WIDE_MODEL_DEF)
    results = {}
    for launcher in ("local", "ray"):
        ws = tmp_path / f"ws-{launcher}"
        extra = ("--launcher", "local", "--force") if launcher == "local" else ()
        done = lb(*on_ray(path, ws, *extra, "--address", ray_cluster.address), cwd=tmp_path)
        assert done.returncode == 0, _shown(done)
        results[launcher] = _final_weights(ws)
    seen = [json.loads((path.parent / f"init.{r}.json").read_text()) for r in range(slots)]
    per_node = CPUS_PER_NODE
    # each rank: its rank, the world, its local rank and the processes on its node, its node's
    # rank of two nodes
    assert [s[:6] for s in seen] == [
        [r, slots, r % per_node, per_node, r // per_node, 2] for r in range(slots)
    ], seen
    ids = ray_cluster.node_ids()
    job = _job(tmp_path / "ws-ray")
    assert job.state == "COMPLETED", job
    assert ids["head"][:12] in job.reason and ids["worker"][:12] in job.reason, job
    _same(results["local"], results["ray"])

    odd = _folder(tmp_path, _config(resources={"slots_per_trial": slots - 1}), name="odd")
    ws = tmp_path / "ws-odd"
    done = lb(*on_ray(odd, ws, "--address", ray_cluster.address), cwd=tmp_path)
    assert done.returncode == 2, _shown(done)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr
    assert f"{slots - 1} slots fit on no single node" in errors[0], errors[0]
    assert f"2 x {CPUS_PER_NODE}" in errors[0], errors[0]
    assert not _experiments(ws)
