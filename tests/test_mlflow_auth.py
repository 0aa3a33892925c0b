"""The MLflow mirror against a tracking server with basic authentication (the `mlflow_server`
of tests/_mlflow_server.py runs `--app-name basic-auth`; marker `mlflow`): the trial's
processes reach it with the credentials of the command's environment, which show in no
argument list, output or file; credentials the server refuses are one line before anything
is recorded.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from lightning_bridge.record._registry import Registry
from lightning_bridge.record._workspace import Workspace
from tests import _folders
from tests._mlflow_server import MlflowServer, mlflow_server
from tests.test_slurm import _config, _folder, _trial_batches, finish

__all__ = ["mlflow_server"]  # the fixture, used by name

pytestmark = pytest.mark.mlflow


def _env(server: MlflowServer, **credentials: str) -> dict[str, str]:
    env = {k: v for k, v in _folders.cli_env().items() if not k.startswith("MLFLOW_TRACKING_")}
    return {**env, "MLFLOW_TRACKING_URI": server.uri, **credentials}


def _run(folder: pathlib.Path, ws: pathlib.Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lightning_bridge",
        "run",
        str(folder),
        "--workspace",
        str(ws),
        *extra,
    ]


def test_refused_credentials_are_one_line_before_anything_is_recorded(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    """A wrong password, or none: exit 2, one line naming the server and the variables to set,
    the password not shown, no experiment recorded."""
    path = _folder(tmp_path, _config())
    wrong = "not-the-password-0123"
    cases = (
        ({"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": wrong}, "the user in"),
        ({}, "it sent no credentials"),
    )
    for number, (credentials, message) in enumerate(cases):
        ws = tmp_path / f"ws{number}"
        done = subprocess.run(
            _run(path, ws),
            cwd=tmp_path,
            env=_env(mlflow_server, **credentials),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("lightning-bridge: error: MLflow at " + mlflow_server.uri)
        assert "HTTP 401" in lines[0] and message in lines[0], lines[0]
        assert "MLFLOW_TRACKING_USERNAME" in lines[0] and "MLFLOW_TRACKING_PASSWORD" in lines[0]
        assert wrong not in done.stdout + done.stderr
        assert not Workspace(ws).registry_path.exists() or not Registry(ws).experiments()


def test_the_trial_mirrors_with_the_credentials_of_its_environment_and_shows_them_nowhere(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    """The credentials in the command's environment only: the trial's process mirrors its
    metrics into the server (its run has every validation); while it trains no process's
    arguments hold the password, and afterwards neither the output nor any file of the
    workspace or the experiment's folder does."""
    from mlflow import MlflowClient

    password = mlflow_server.password
    path = _folder(tmp_path, _config())
    ws = tmp_path / "ws"
    gate = _folders.Gate.at(tmp_path / "gate")  # the trial is held at batch 2 until released
    command = _run(path, ws, *gate.options(2))
    coordinator = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=_env(mlflow_server, **mlflow_server.credentials),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        gate.wait(1, timeout=600, seen=lambda: _trial_batches(ws))
        arguments = []
        for entry in pathlib.Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    arguments.append((entry / "cmdline").read_bytes())
                except OSError:
                    continue
        assert any(b"_trial" in a for a in arguments)
        assert not [a for a in arguments if password.encode() in a]
    finally:
        gate.release()
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    assert password not in out
    with Registry(ws) as registry:
        validations = registry.metrics(1, "validation")
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    key = f"{ws.resolve()}#1"
    found = client.search_experiments(filter_string=f"tags.`lightning_bridge.key` = '{key}'")
    assert len(found) == 1, found
    runs = client.search_runs([found[0].experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs
    history = client.get_metric_history(runs[0].info.run_id, "validation_loss")
    assert len(history) == len(validations) > 0, (history, validations)
    held = [p for p in tmp_path.rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert not held, held
