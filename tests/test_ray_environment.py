"""`environment.environment_variables` on the two-node Ray test cluster (marker `ray`): a
trial across both nodes (one process on each) sees the config's variables on both, after the
node's own environment and `ray.runtime_env`'s, and no value is in what the run printed or
in `experiment describe`."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from lightning_bridge.record._registry import Registry
from tests._env_probes import TRIAL_PROBE
from tests._folders import BASE_CONFIG, write_folder
from tests._ray_cluster import RayCluster
from tests._servers import moto_server, s3_filesystem
from tests.test_secrets import BUCKET, RECORD_FILES, SecretRun
from tests.test_slurm import lb

pytestmark = pytest.mark.ray

VALUE = "value-only-in-the-config-3be9"


def test_both_nodes_processes_see_the_configs_variables(
    tmp_path: pathlib.Path, ray_cluster: RayCluster
) -> None:
    config = copy.deepcopy(BASE_CONFIG)
    runtime_env = {"env_vars": {"OVERRIDDEN": "ray.runtime_env", "FROM_SHELL": "runtime_env"}}
    config.update(
        entrypoint="probe_def:ProbeTrial",
        resources={"slots_per_trial": 2},
        ray={"slots_per_node": 1, "runtime_env": runtime_env},
        max_restarts=0,
        environment={"environment_variables": {"cpu": [f"OVERRIDDEN={VALUE}", "DEVICE=cpu"]}},
    )
    config["hyperparameters"] = {**config["hyperparameters"], "out": str(tmp_path), "name": "r"}
    config["searcher"] = {**config["searcher"], "max_length": {"batches": 2}}
    folder = write_folder(tmp_path, config).parent
    (folder / "probe_def.py").write_text(TRIAL_PROBE)
    ws = tmp_path / "ws"
    run = ["run", "const.yaml", "--launcher", "ray", "--accelerator", "cpu"]
    done = lb(*run, "--workspace", str(ws), cwd=folder, env={"RAY_ADDRESS": ray_cluster.address})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in ("0", "1"):
        seen = json.loads((tmp_path / f"env.r.{rank}.json").read_text())
        seen.pop("RANK")  # the launcher's own, which it need not export to every rank
        assert seen == {
            "FROM_SHELL": "runtime_env",  # the node's environment, Ray's runtime_env in it
            "OVERRIDDEN": VALUE,  # then the config's
            "HOOKED": None,
            "DEVICE": "cpu",
        }, seen
    with Registry(ws) as registry:
        assert registry.trial(1).state == "COMPLETED"
    describe = lb("experiment", "describe", "1", "--workspace", str(ws), cwd=folder)
    assert describe.returncode == 0 and "COMPLETED" in describe.stdout
    assert VALUE not in done.stdout + done.stderr


def test_secrets_reach_the_ray_trial_and_nobody_else(
    tmp_path: pathlib.Path, ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local launcher's secrets sweep (`test_secrets.py`) on Ray: no actor's or worker's
    argument list holds a secret, nor the files, the record's commands or the bucket."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    with moto_server() as endpoint:
        s3_filesystem(endpoint).mkdir(BUCKET)
        run = SecretRun.at(tmp_path, endpoint)
        printed = run.run("--launcher", "ray", "--accelerator", "cpu")
        run.check_nobody_else(printed, endpoint, RECORD_FILES)
