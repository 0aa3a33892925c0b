"""`--launcher slurm`: trials as sbatch jobs on a real two-node Slurm cluster (marker `slurm`,
the cluster of `_slurm_cluster`), and the refusals and sbatch options that need no cluster.

The trial is the CLI tests' linear trial, slowed by `delay` seconds per batch so that a test
can requeue or pause its job mid-run; every run on Slurm is compared with the same trial run
locally (the local launcher, in this process): same final weights, bit for bit.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import yaml

from lightning_bridge.experiment._cli import main
from lightning_bridge.experiment._runner import Options, prepare
from lightning_bridge.experiment._slurm import SlurmSettings
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._workspace import Workspace
from tests._folders import (  # noqa: F401 - fixture
    BASE_CONFIG,
    checkpoint_weights,
    isolated_imports,
)
from tests._folders import LINEAR_MODEL_DEF as MODEL_DEF
from tests._slurm_cluster import (
    SlurmCluster,
    slurm_cluster_fixture,  # noqa: F401 - fixture
)

SLOW_MODEL_DEF = MODEL_DEF.replace("import signal\n", "import signal\nimport time\n").replace(
    "        x, y = batch\n        loss = torch",
    "        time.sleep(self.context.get_hparams().get('delay', 0))\n"
    "        x, y = batch\n        loss = torch",
)
assert SLOW_MODEL_DEF != MODEL_DEF


def _config(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        **BASE_CONFIG,
        "hyperparameters": {**BASE_CONFIG["hyperparameters"], "delay": 0.0},
        "searcher": {**BASE_CONFIG["searcher"], "max_length": {"batches": 24}},
        "min_validation_period": {"batches": 8},
        "min_checkpoint_period": {"batches": 2},
        "max_restarts": 0,
    }
    config.update(changes)
    return config


def _folder(root: pathlib.Path, config: dict[str, Any], name: str = "exp") -> pathlib.Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(SLOW_MODEL_DEF)
    (folder / "const.yaml").write_text(yaml.safe_dump(config))
    return folder / "const.yaml"


def _final_weights(workspace: pathlib.Path, trial_id: int = 1) -> dict[str, torch.Tensor]:
    with Registry(workspace) as registry:
        latest = registry.latest_checkpoint(trial_id)
    assert latest is not None
    return checkpoint_weights(pathlib.Path(latest.location))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_bridge", *args]


def _env() -> dict[str, str]:
    root = str(pathlib.Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The trial's final weights run locally (in a subprocess, as a user runs it)."""
    root = tmp_path_factory.mktemp("local")
    config = _folder(root, _config())
    done = subprocess.run(
        _cli("run", str(config), "--workspace", str(root / "ws"), "--accelerator", "cpu"),
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _final_weights(root / "ws")


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _trial_batches(workspace: pathlib.Path) -> int:
    if not Workspace(workspace).registry_path.exists():
        return 0
    try:
        with Registry(workspace) as registry:
            trials = registry.trials()
            return trials[0].batches_trained if trials else 0
    except Exception:  # noqa: BLE001 - the registry being created
        return 0


def _job(workspace: pathlib.Path, trial_id: int = 1) -> Any:
    with Registry(workspace) as registry:
        return registry.job(trial_id)


# ----- no cluster needed -----


def test_sbatch_options_map_determined_keys(tmp_path: pathlib.Path) -> None:
    config = _config(
        resources={"slots_per_trial": 4, "resource_pool": "gpu-a100"},
        slurm={"slots_per_node": 2, "gpu_type": "a100", "sbatch_args": ["--time=01:00:00"]},
        max_restarts=3,
    )
    settings = SlurmSettings.of(prepare(_folder(tmp_path, config), None, Options()))
    assert settings.nodes == 2 and settings.partition == "gpu-a100"
    assert settings.resources(gpus=True) == [
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gres=gpu:a100:2",
    ]
    assert settings.sbatch_args == ("--time=01:00:00",) and settings.max_restarts == 3
    one_node = SlurmSettings.of(prepare(_folder(tmp_path, _config(), "one"), None, Options()))
    assert one_node.resources(gpus=False) == ["--nodes=1", "--ntasks=1", "--cpus-per-task=1"]


def test_refused_without_sbatch(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _folder(tmp_path, _config())
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path / "nothing")
    try:
        code = main(["run", str(config), "--launcher", "slurm", "--workspace", "ws"])
    finally:
        os.environ["PATH"] = env_path
    assert code == 2
    assert "sbatch is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()  # nothing recorded


# ----- on the test cluster -----


@pytest.mark.slurm
def test_refusals_before_submitting(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (_config(resources={"resource_pool": "nowhere"}), "'nowhere' is not a partition"),
        (_config(slurm={"slots_per_node": 64}), "no node of partition debug has that many"),
        (_config(slurm={"sbatch_args": ["--time=bogus"]}), "Slurm refuses the trial's job"),
    ]
    for number, (config, expected) in enumerate(cases):
        path = _folder(tmp_path, config, f"exp{number}")
        args = ["run", str(path), "--launcher", "slurm", "--accelerator", "cpu"]
        assert main([*args, "--workspace", "ws"]) == 2
        err = capsys.readouterr().err
        assert expected in err, err
    assert not slurm_cluster.jobs()
    assert not (tmp_path / "ws").exists()  # nothing recorded


@pytest.mark.slurm
def test_single_trial_is_a_job_with_the_local_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    config = _folder(tmp_path, _config())
    ws = str(tmp_path / "ws")
    done = subprocess.run(
        _cli("run", str(config), "--launcher", "slurm", "--accelerator", "cpu", "--workspace", ws),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Slurm job" in done.stdout
    job = _job(tmp_path / "ws")
    assert job.state == "COMPLETED" and job.restarts == 0
    _same(_final_weights(tmp_path / "ws"), local_weights)
    describe = subprocess.run(
        _cli("experiment", "describe", "1", "--workspace", ws),
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"slurm job {job.job_id} COMPLETED" in describe
    logs = subprocess.run(
        _cli("trial", "logs", "1", "--workspace", ws),
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"slurm job {job.job_id} (COMPLETED)" in logs and "Training" in logs


@pytest.mark.slurm
def test_requeued_job_continues_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    config = _folder(tmp_path, _config(hyperparameters={**_config()["hyperparameters"]}))
    ws = tmp_path / "ws"
    args = ["run", str(config), "--launcher", "slurm", "--accelerator", "cpu"]
    slow = ["--set", "hyperparameters.delay=0.4"]
    # The delay does not change the weights: the local run (delay 0) is the reference.
    coordinator = subprocess.Popen(
        _cli(*args, *slow, "--workspace", str(ws)),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(lambda: _trial_batches(ws) >= 6, 180, "the trial to train 6 batches")
        job = _job(ws)
        slurm_cluster.run("scontrol", "requeue", job.job_id)
        out, _ = coordinator.communicate(timeout=240)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    assert coordinator.returncode == 0, out[-4000:]
    job = _job(ws)
    assert job.state == "COMPLETED" and job.restarts == 1, job
    with Registry(ws) as registry:
        trial = registry.trial(1)
    assert trial.state == "COMPLETED" and trial.batches_trained == 24 and trial.runs == 2
    _same(_final_weights(ws), local_weights)


@pytest.mark.slurm
def test_crashing_job_is_restarted_then_recorded_error(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    hparams = {**_config()["hyperparameters"], "fail": "init"}
    config = _folder(tmp_path, _config(hyperparameters=hparams, max_restarts=1))
    ws = str(tmp_path / "ws")
    done = subprocess.run(
        _cli("run", str(config), "--launcher", "slurm", "--accelerator", "cpu", "--workspace", ws),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    job = _job(tmp_path / "ws")
    assert job.restarts == 1  # max_restarts: 1
    with Registry(tmp_path / "ws") as registry:
        trial = registry.trial(1)
    assert trial.state == "ERROR" and "deliberate failure in __init__" in trial.message
    output = pathlib.Path(job.output).read_text()
    assert output.count("deliberate failure in __init__") >= 2  # both runs' tracebacks


@pytest.mark.slurm
def test_coordinator_signal_pauses_and_continue_resumes(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    config = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    args = ["run", str(config), "--launcher", "slurm", "--accelerator", "cpu"]
    coordinator = subprocess.Popen(
        _cli(*args, "--set", "hyperparameters.delay=0.4", "--workspace", str(ws)),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(lambda: _trial_batches(ws) >= 4, 180, "the trial to train 4 batches")
        coordinator.send_signal(signal.SIGTERM)
        out, _ = coordinator.communicate(timeout=120)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    assert coordinator.returncode == 0, out[-4000:]
    assert "Pausing Slurm job" in out
    with Registry(ws) as registry:
        trial = registry.trial(1)
    assert trial.state == "STOPPED" and 4 <= trial.batches_trained < 24, trial
    done = subprocess.run(
        _cli("experiment", "continue", "1", "--workspace", str(ws)),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Slurm job" in done.stdout  # continued through the recorded launcher
    with Registry(ws) as registry:
        trial = registry.trial(1)
    assert trial.state == "COMPLETED" and trial.batches_trained == 24
    _same(_final_weights(ws), local_weights)


@pytest.mark.slurm
def test_adaptive_asha_search_runs_its_trials_as_jobs(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    from tests import _folders as sf

    config = {
        **sf.SEARCH_CONFIG,
        "searcher": {
            "name": "adaptive_asha",
            "metric": "validation_loss",
            "max_trials": 4,
            "max_time": 16,
            "time_metric": "batches",
            "divisor": 2,
            "mode": "aggressive",
            "max_rungs": 3,
            "max_concurrent_trials": 2,
        },
    }
    path = sf.write_folder(tmp_path, config, "exp", sf.TINY)
    ws = tmp_path / "ws"
    done = subprocess.run(
        _cli(
            "run", str(path), "--launcher", "slurm", "--accelerator", "cpu", "--workspace", str(ws)
        ),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with Registry(ws) as registry:
        trials = registry.trials(1)
        jobs = {j.trial_id: j for j in registry.jobs(1)}
        best = registry.best_checkpoints(1, 1)
    assert len(trials) == 4 and set(jobs) == {t.id for t in trials}
    assert len({j.job_id for j in jobs.values()}) == 4  # one job per trial
    assert all(j.state == "COMPLETED" for j in jobs.values()), jobs
    assert all(t.state == "COMPLETED" for t in trials), trials
    lengths = sorted(t.batches_trained for t in trials)
    assert lengths[-1] == 16 and lengths[0] < 16, lengths  # stopped at a rung
    assert best and best[0].uuid in done.stdout  # the summary lists the best checkpoint


@pytest.mark.slurm
def test_experiment_pause_and_kill_commands(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    slow = ["--set", "hyperparameters.delay=0.4", "--workspace", str(ws)]

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            _cli(*args, "--launcher", "slurm", *slow[2:] if args[0] == "experiment" else slow),
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    coordinator = start("run", str(config), "--accelerator", "cpu")
    try:
        _wait_for(lambda: _trial_batches(ws) >= 4, 180, "the trial to train 4 batches")
        assert main(["experiment", "pause", "1", "--workspace", str(ws)]) == 0
        assert "checkpoints and stops" in capsys.readouterr().out
        out, _ = coordinator.communicate(timeout=120)
        assert coordinator.returncode == 0, out[-3000:]
        with Registry(ws) as registry:
            paused = registry.trial(1)
        assert paused.state == "STOPPED" and paused.batches_trained < 24, paused
        coordinator = start("experiment", "continue", "1")
        _wait_for(
            lambda: _trial_batches(ws) > paused.batches_trained + 1, 180, "the trial to go on"
        )
        assert main(["experiment", "kill", "1", "--workspace", str(ws)]) == 0
        assert "killed" in capsys.readouterr().out
        out, _ = coordinator.communicate(timeout=120)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    job = _job(ws)
    with Registry(ws) as registry:
        killed = registry.trial(1)
    assert killed.state == "STOPPED" and "killed" in killed.message, killed
    assert killed.batches_trained < 24 and job.state == "CANCELLED", job
    _wait_for(lambda: not slurm_cluster.jobs(), 30, "squeue to list no job")


@pytest.mark.slurm
def test_two_node_trial_equals_its_two_process_single_node_run(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    config = _config(resources={"slots_per_trial": 2}, slurm={"slots_per_node": 1})
    path = _folder(tmp_path, config)
    results = {}
    for launcher in ("local", "slurm"):
        ws = tmp_path / f"ws-{launcher}"
        done = subprocess.run(
            _cli("run", str(path), "--launcher", launcher, "--accelerator", "cpu")
            + ["--workspace", str(ws), "--force"],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=400,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with Registry(ws) as registry:
            results[launcher] = registry.metrics(1, "validation")
        if launcher == "slurm":
            job = _job(ws)
            script = (ws / "experiments/1/trials/1/job.sh").read_text()
            assert "srun" in script and job.state == "COMPLETED"
            # What each rank's __init__ saw: rank and size from Slurm's two tasks (local and
            # cross sizes group ranks by host, and both test nodes are this one host).
            seen = [json.loads((path.parent / f"init.{r}.json").read_text()) for r in (0, 1)]
            assert [s[:2] for s in seen] == [[0, 2], [1, 2]]
        results[launcher + "-weights"] = _final_weights(ws)  # type: ignore[assignment]
    _same(results["local-weights"], results["slurm-weights"])  # type: ignore[arg-type]
    assert [m.values for m in results["local"]] == [m.values for m in results["slurm"]]


@pytest.mark.slurm
@pytest.mark.postgres
def test_a_record_the_nodes_cannot_reach_stops_a_search_at_its_first_job(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, postgres: Any
) -> None:
    """The record is a PostgreSQL server found through libpq's PGHOST / PGPORT: the submitting
    machine's reach it, the jobs' (`--export` in sbatch_args) name a closed port. The first job
    ends before training naming the record; the search submits no other trial and fails with
    that message."""
    import socket

    import sqlalchemy

    name = f"record_{os.getpid()}"
    engine = sqlalchemy.create_engine(
        postgres.url.replace("postgresql://", "postgresql+psycopg://"),
        isolation_level="AUTOCOMMIT",
    )
    with engine.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    url = f"postgresql://postgres@/{name}"
    (ws / "workspace.json").write_text(json.dumps({"record": url}))
    searcher = {"name": "random", "metric": "validation_loss", "max_trials": 3}
    searcher.update(max_concurrent_trials=1, max_length={"batches": 8})
    slurm = {"sbatch_args": [f"--export=ALL,PGPORT={closed}"]}
    config = _folder(tmp_path, _config(slurm=slurm, searcher=searcher))
    env = {**_env(), "PGHOST": "127.0.0.1", "PGPORT": str(postgres.port)}
    args = ("run", str(config), "--launcher", "slurm", "--accelerator", "cpu")
    done = subprocess.run(
        _cli(*args, "--workspace", str(ws)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    said = f"lightning-bridge: error: unreachable from node {socket.gethostname()}: "
    assert said + f"the experiment record {url}" in done.stderr
    os.environ["PGHOST"], os.environ["PGPORT"] = "127.0.0.1", str(postgres.port)
    try:
        with Registry(ws) as registry:
            trials, job = registry.trials(), registry.job(1)
    finally:
        del os.environ["PGHOST"], os.environ["PGPORT"]
    (trial,) = trials  # no second trial submitted
    assert trial.state == "ERROR" and f"the experiment record {url}" in trial.message
    assert trial.batches_trained == 0 and job is not None and job.state == "FAILED"
