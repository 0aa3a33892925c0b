"""`environment.environment_variables` on the two-node Slurm test cluster (marker `slurm`):
a trial across both nodes (one task per node) sees the config's variables in every task, the
startup hook (run in the job's batch shell) sees them too, and no value is on the job's command
lines or in the job script kept on disk."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from lightning_bridge.experiment.launch.slurm._launcher import HOOK_ENV
from lightning_bridge.record._registry import Registry
from tests._env_probes import HOOK, TRIAL_PROBE
from tests._folders import BASE_CONFIG, workspace, write_folder
from tests._servers import moto_server, s3_filesystem
from tests._slurm_cluster import SlurmCluster, slurm_cluster_fixture  # noqa: F401 - fixture
from tests.test_secrets import BUCKET, RECORD_FILES, SecretRun
from tests.test_slurm import lb

VALUE = "value-only-in-the-config-7d1f"


@pytest.mark.slurm
def test_every_task_of_a_two_node_job_sees_the_configs_variables(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    config = copy.deepcopy(BASE_CONFIG)
    config.update(
        entrypoint="probe_def:ProbeTrial",
        resources={"slots_per_trial": 2},
        slurm={"slots_per_node": 1},
        max_restarts=0,
        environment={"environment_variables": [f"OVERRIDDEN={VALUE}", "DEVICE=cpu"]},
    )
    config["hyperparameters"] = {**config["hyperparameters"], "out": str(tmp_path), "name": "s"}
    config["searcher"] = {**config["searcher"], "max_length": {"batches": 2}}
    folder = write_folder(tmp_path, config).parent
    (folder / "probe_def.py").write_text(TRIAL_PROBE)
    (folder / "startup-hook.sh").write_text(HOOK)
    ws = tmp_path / "ws"
    args = ["run", "const.yaml", "--launcher", "slurm", "--accelerator", "cpu"]
    shell = {"FROM_SHELL": "shell", "OVERRIDDEN": "shell"}
    done = lb(*args, "--workspace", str(ws), cwd=folder, env=shell)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in ("0", "1"):
        seen = json.loads((tmp_path / f"env.s.{rank}.json").read_text())
        assert seen == {
            "FROM_SHELL": "shell",
            "OVERRIDDEN": VALUE,
            "HOOKED": f"{VALUE}-hook",
            "DEVICE": "cpu",
            "RANK": rank,
        }
    with Registry(ws) as registry:
        job = registry.job(1)
    assert job.state == "COMPLETED", job
    # The job's script and its sbatch line carry no value: the trial's process sets them.
    script = (ws / "experiments/1/trials/1/job.sh").read_text()
    assert "srun" in script and VALUE not in script
    assert VALUE not in done.stdout + done.stderr


@pytest.mark.slurm
def test_secrets_reach_the_slurm_trial_and_nobody_else(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    """The local launcher's secrets sweep (`test_secrets.py`) on Slurm: the job's sbatch and
    srun lines hold no secret; its script and the startup hook's exports, which hold the
    token, are 0600."""
    with moto_server() as endpoint:
        s3_filesystem(endpoint).mkdir(BUCKET)
        run = SecretRun.at(tmp_path, endpoint)
        printed = run.run("--launcher", "slurm", "--accelerator", "cpu")
        assert (workspace(run.folder) / "experiments/1/trials/1/job.sh").is_file()
        run.check_nobody_else(printed, endpoint, (*RECORD_FILES, HOOK_ENV))
