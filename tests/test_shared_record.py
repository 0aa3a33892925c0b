"""The workspace's settings (`workspace.json`: its default launcher, its record's server) and
the services every trial reports to wherever it runs: the record on a real PostgreSQL server
(the `postgres` fixture) lists, describes and continues as the SQLite record does; SQLite on a
network file system is refused or warned about (a synthetic mounts table); a service a node
cannot reach is named before training; a job's task across nodes knows its node's rank and
size."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys
from typing import Any

import pytest
import torch

from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.experiment.cli._main import main
from lightning_bridge.experiment.config._config import load_config
from lightning_bridge.experiment.config._plan import Options
from lightning_bridge.experiment.launch.local._launcher import LocalLauncher
from lightning_bridge.experiment.launch.slurm._job import (
    EXIT_UNREACHABLE,
    task_environment,
    unreachable,
)
from lightning_bridge.experiment.launch.slurm._job import main as job_main
from lightning_bridge.experiment.launch.slurm._launcher import SlurmLauncher, _outcome
from lightning_bridge.experiment.trials._experiments import options_record
from lightning_bridge.record._filesystem import filesystem_type, network_filesystem
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.search import SearchDriver
from lightning_bridge.translation.services._run_description import RecordConnection, RunDescription
from tests._folders import (  # isolated_imports: an autouse fixture
    BASE_CONFIG,
    checkpoint_weights,
    isolated_imports,  # noqa: F401
    kept_checkpoints,
    run_in_process,
    write_folder,
)
from tests._servers import PostgresServer
from tests.test_record import write_at_once_one_killed

MOUNTS = """\
sysfs /sys sysfs rw,nosuid 0 0
/dev/sda1 / ext4 rw,relatime 0 0
server:/export/home /home nfs4 rw,vers=4.2,addr=10.0.0.1 0 0
/dev/sdb1 /home/me/local\\040disk ext4 rw 0 0
lustre@o2ib:/scratch /scratch lustre rw 0 0
tmpfs /scratch/tmp tmpfs rw 0 0
"""


def _settings(workspace: pathlib.Path, **values: Any) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "workspace.json").write_text(json.dumps(values))


# ----- the default launcher -----


def _run(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    searcher = {**BASE_CONFIG["searcher"], "max_length": {"batches": 4}}
    config = write_folder(tmp_path, {**BASE_CONFIG, "searcher": searcher})
    capsys.readouterr()
    code = main(["run", str(config), "--workspace", str(tmp_path / "ws"), *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_workspace_setting_is_the_default_launcher_and_the_command_line_wins(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    _settings(workspace, launcher="slurm")
    with pytest.MonkeyPatch.context() as patch:  # a machine without Slurm's commands
        patch.setenv("PATH", str(tmp_path / "no-slurm"))
        assert shutil.which("sbatch") is None
        code, out = _run(tmp_path, capsys)
    assert code == 2
    assert "--launcher slurm: sbatch is not on PATH" in out
    assert not (workspace / "registry.sqlite").exists()  # refused before anything recorded
    code, out = _run(tmp_path, capsys, "--launcher", "local")
    assert code == 0, out
    with Registry(workspace) as registry:
        (experiment,) = registry.experiments()
        assert experiment.options["launcher"] == "local"
        assert registry.trials()[0].batches_trained == 4


@pytest.mark.processes
def test_a_search_worker_runs_the_searchs_launcher_unless_its_command_line_names_one(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search started on a Slurm login node (`run --launcher slurm --storage FILE`, its
    search as that writes it) joined by a worker on a machine without Slurm: the search's
    launcher applies, not the worker workspace's setting, and is refused before anything is
    recorded; `--launcher local` on the worker's command line wins and trains the trial."""
    searcher = {
        **BASE_CONFIG["searcher"], "name": "random", "max_trials": 1,
        "max_length": {"batches": 4},
    }  # fmt: skip
    path = write_folder(tmp_path, {**BASE_CONFIG, "searcher": searcher})
    config = load_config(path)
    storage = str(tmp_path / "search.journal")
    driver = SearchDriver(storage, "on-slurm", config.search)
    options = Options(launcher="slurm", accelerator="cpu")
    driver.set_search_note(
        "experiment",
        {
            "config": config.raw,
            "config_path": str(path),
            "context_dir": str(path.parent),
            "options": options_record(options),
            "source_dir": None,
        },
    )
    driver.close()
    workspace = tmp_path / "ws"
    _settings(workspace, launcher="local")
    worker = ["search-worker", "on-slurm", "--storage", storage, "--workspace", str(workspace)]
    with pytest.MonkeyPatch.context() as patch:  # a machine without Slurm's commands
        patch.setenv("PATH", str(tmp_path / "no-slurm"))
        capsys.readouterr()
        assert main(worker) == 2
    assert "--launcher slurm: sbatch is not on PATH" in capsys.readouterr().err
    assert not (workspace / "registry.sqlite").exists()  # refused before anything recorded
    assert main([*worker, "--launcher", "local"]) == 0, capsys.readouterr()
    with Registry(workspace) as registry:
        (experiment,) = registry.experiments()
        assert experiment.options["launcher"] == "local"
        (trial,) = registry.trials()
        assert trial.state == "COMPLETED" and trial.batches_trained == 4
        assert registry.job(trial.id) is None  # no scheduler's job
    help_text = subprocess.run(
        [sys.executable, "-m", "lightning_bridge", "search-worker", "--help"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    assert "default: the search's own, the one it was started with" in help_text


def test_an_unknown_launcher_setting_is_refused_with_the_names(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "ws"
    _settings(workspace, launcher="kubernetes")
    code, out = _run(tmp_path, capsys)
    assert code == 2
    assert f"{workspace / 'workspace.json'}: launcher kubernetes: unknown launcher" in out
    assert "choose one of local, slurm" in out
    _settings(workspace, launcher="local", queue="gpu")
    code, out = _run(tmp_path, capsys)
    assert code == 2 and "unknown setting 'queue'" in out and "launcher, record" in out
    assert not (workspace / "registry.sqlite").exists()


def test_a_record_setting_must_be_a_postgresql_url(tmp_path: pathlib.Path) -> None:
    _settings(tmp_path, record="sqlite:////shared/registry.sqlite")
    with pytest.raises(Exception, match="is not a postgresql:// URL"):
        Registry(tmp_path)


# ----- SQLite on a network file system -----


def test_the_file_system_of_a_folder_is_read_from_the_mounts_table() -> None:
    assert filesystem_type(pathlib.Path("/home/me/ws"), MOUNTS) == "nfs4"
    assert filesystem_type(pathlib.Path("/home/me/local disk/ws"), MOUNTS) == "ext4"
    assert filesystem_type(pathlib.Path("/homework"), MOUNTS) == "ext4"  # not under /home
    assert network_filesystem(pathlib.Path("/home/me/ws"), MOUNTS) == "nfs4"
    assert network_filesystem(pathlib.Path("/scratch/team/ws"), MOUNTS) == "lustre"
    assert network_filesystem(pathlib.Path("/scratch/tmp/ws"), MOUNTS) is None
    assert network_filesystem(pathlib.Path("/opt/ws"), MOUNTS) is None


def test_sqlite_on_a_network_file_system_is_refused_across_machines_and_warned_on_one(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    mounts = f"/dev/sda1 / ext4 rw 0 0\nserver:/export {tmp_path} nfs4 rw 0 0\n"
    workspace = Workspace(tmp_path / "ws")
    with pytest.raises(Exception) as refused:
        SlurmLauncher().check_record(workspace, mounts)
    message = str(refused.value)
    assert "--launcher slurm runs trials on several machines" in message
    assert f"{workspace.registry_path} is an SQLite database on a network file system (nfs4)" in (
        message
    )
    assert "SQLite's locking is unreliable" in message
    assert '{"record": "postgresql://USER:PASSWORD@HOST/DATABASE"}' in message
    assert str(workspace.root / "workspace.json") in message
    with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
        LocalLauncher().check_record(workspace, mounts)
    assert "SQLite's locking is unreliable" in caplog.text
    # A local disk, or a record on PostgreSQL: nothing to say.
    SlurmLauncher().check_record(workspace, "/dev/sda1 / ext4 rw 0 0\n")
    _settings(workspace.root, record="postgresql://u@db.example/record")
    SlurmLauncher().check_record(workspace, mounts)


# ----- a service a node cannot reach -----


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed once the socket is


def test_a_job_names_the_record_or_the_storage_it_cannot_reach(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _closed_port()
    url = f"postgresql://team:secret@127.0.0.1:{port}/record"
    _settings(tmp_path / "ws", record=url)
    run = RunDescription(record=RecordConnection(str(tmp_path / "ws"), 1, 1))
    problem = unreachable(run)
    assert problem is not None
    assert f"the experiment record postgresql://team:***@127.0.0.1:{port}/record" in problem
    assert "cannot be reached from" in problem and "secret" not in problem
    # The submitting machine's commands say the same, before anything is recorded.
    capsys.readouterr()
    assert main(["experiment", "list", "--workspace", str(tmp_path / "ws")]) == 2
    said = capsys.readouterr().err
    assert f"postgresql://team:***@127.0.0.1:{port}/record (set in {tmp_path}" in said
    # An SQLite record that is not on the node's file systems (the workspace not shared).
    (tmp_path / "ws" / "workspace.json").unlink()
    problem = unreachable(run)
    assert problem is not None and "is not on this node's file systems" in problem
    assert not (tmp_path / "ws" / "registry.sqlite").exists()  # nothing created there


def test_a_job_that_cannot_reach_the_record_ends_before_training_and_says_so(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job's start on a node (`_slurm_job`) against a record it cannot reach, then the
    coordinator's reading of the job's output: the trial is recorded ERROR with the message
    naming the record, and the run's exit code says it failed."""
    workspace = tmp_path / "ws"
    with Registry(workspace) as registry:  # the coordinator recorded the trial and its job
        experiment = registry.create_experiment({"name": "x"}, name="x")
        trial_id = registry.create_trial(experiment, hparams={}, seed=0)
        output = tmp_path / "slurm-7.out"
        registry.job_submitted(trial_id, "slurm", "7", str(output))
    run_file = tmp_path / "run.json"
    RunDescription(record=RecordConnection(str(workspace), experiment, trial_id)).write(run_file)
    url = f"postgresql://team@127.0.0.1:{_closed_port()}/record"
    _settings(workspace, record=url)  # as the node sees it: a server it cannot reach
    capsys.readouterr()
    assert job_main([str(run_file)]) == EXIT_UNREACHABLE
    said = capsys.readouterr().err
    assert said.startswith(f"lightning-bridge: error: unreachable from node {socket.gethostname()}")
    assert f"the experiment record {url}" in said
    output.write_text(f"some start-up line\n{said}")
    (workspace / "workspace.json").unlink()  # the coordinator reaches its record
    with Registry(workspace) as registry:
        assert _outcome(registry, trial_id, "7", output, paused=False) == 1
        trial = registry.trial(trial_id)
        assert SlurmLauncher().unreachable(registry, trial_id) == trial.message
    assert trial.state == "ERROR"
    assert trial.message.startswith(f"unreachable from node {socket.gethostname()}: ")
    assert f"the experiment record {url}" in trial.message
    assert f"trial {trial_id}: unreachable from node" in capsys.readouterr().err


# ----- a task's place across nodes -----


def test_a_task_of_a_job_across_nodes_knows_its_node_and_its_neighbours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes of two tasks each (srun's environment of the second task of node 1): the
    trial's DistributedContext and cluster info give Determined's ranks and sizes."""
    from lightning_bridge.translation.services._cluster_info import ClusterInfo

    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_JOB_ID": "104321",
    }
    env = task_environment(slurm)
    assert env == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_PORT": "19321",  # Lightning's Slurm environment's port of job 104321
    }
    assert "GROUP_RANK" not in env  # Lightning keeps its Slurm environment
    uneven = task_environment({**slurm, "SLURM_STEP_TASKS_PER_NODE": "3,1"})
    assert uneven["LOCAL_WORLD_SIZE"] == "1"  # node 1 runs one of the four
    for name in ("GROUP_RANK", "NUM_NODES", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, "WORLD_SIZE": "4"}.items():  # the process group's size
        monkeypatch.setenv(name, value)
    d = DistributedContext()
    assert (d.rank, d.size, d.local_rank, d.local_size) == (3, 4, 1, 2)
    assert (d.cross_rank, d.cross_size) == (1, 2)
    assert ClusterInfo(RunDescription()).container_rank == 1


# ----- the record on PostgreSQL -----


@pytest.mark.postgres
def test_the_record_on_postgresql_lists_describes_and_continues_as_sqlite(
    tmp_path: pathlib.Path, postgres: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run on both records: stopped by SIGTERM during batch 10, then continued; the
    records list and describe the same, and the weights are bit-exact."""
    config = write_folder(tmp_path)
    previous = pathlib.Path.cwd()
    os.chdir(tmp_path)
    described: dict[str, Any] = {}
    try:
        for kind in ("sqlite", "postgres"):
            workspace = tmp_path / kind
            if kind == "postgres":
                _settings(workspace, record=postgres.new_database())

            def cli(*args: str, ws: pathlib.Path = workspace) -> Any:
                return main([*args, "--workspace", str(ws)])

            stopped = run_in_process(cli, ["run", str(config)], "10")
            assert "Stopped by SIGTERM after batch 11" in stopped
            run_in_process(cli, ["experiment", "continue", "1"])
            capsys.readouterr()
            assert cli("experiment", "list", "--json") == 0
            listed = json.loads(capsys.readouterr().out)
            assert cli("experiment", "describe", "1", "--json") == 0
            described[kind] = (listed, json.loads(capsys.readouterr().out))
    finally:
        os.chdir(previous)
    assert not (tmp_path / "postgres" / "registry.sqlite").exists()  # the record is the server
    (sqlite_list, sqlite_one), (pg_list, pg_one) = described["sqlite"], described["postgres"]
    assert [(e["id"], e["state"], e["trials"]) for e in pg_list] == [(1, "COMPLETED", 1)]
    assert [(e["id"], e["state"], e["trials"]) for e in sqlite_list] == [(1, "COMPLETED", 1)]
    (pg_trial,), (sqlite_trial,) = pg_one["trials"], sqlite_one["trials"]
    assert pg_trial["state"] == "COMPLETED" and pg_trial["runs"] == 2
    for key in ("batches_trained", "hparams", "seed", "validation"):
        if key == "validation":
            want = [(m["batches"], m["values"]) for m in sqlite_trial[key]]
            assert [(m["batches"], m["values"]) for m in pg_trial[key]] == want
        else:
            assert pg_trial[key] == sqlite_trial[key]
    assert pg_one["best_checkpoint"]["metrics"] == sqlite_one["best_checkpoint"]["metrics"]
    pg_weights = checkpoint_weights(kept_checkpoints(1, tmp_path / "postgres")[-1])
    for key, value in checkpoint_weights(kept_checkpoints(1, tmp_path / "sqlite")[-1]).items():
        torch.testing.assert_close(pg_weights[key], value, rtol=0, atol=0)


@pytest.mark.postgres
def test_concurrent_writers_and_a_killed_one_on_postgresql(
    tmp_path: pathlib.Path, postgres: PostgresServer
) -> None:
    """Four processes open a new PostgreSQL record at once (creating its tables) and write, one
    is killed half way: every committed row is there and the ids are unique."""
    workspace = tmp_path / "ws"
    _settings(workspace, record=postgres.new_database())
    write_at_once_one_killed(workspace, tmp_path / "writer.py")
    with Registry(workspace) as registry:
        assert sorted(e.id for e in registry.experiments()) == [1, 2, 3, 4]
        counts = sorted(len(registry.metrics(t.id)) for t in registry.trials())
        assert counts == [30, 60, 60, 60]
        assert len(registry.checkpoints()) == 3 * 6 + 3
        (gone,) = registry.reconcile()
        assert registry.trial(gone).state == "ERROR"
    assert not (workspace / "registry.sqlite").exists()
