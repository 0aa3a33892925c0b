"""`checkpoint_storage: s3` end to end against a real S3 protocol server (moto's server mode
on 127.0.0.1): checkpoints uploaded whole, retention applied in the bucket, a stopped run
continued from the bucket to the same weights, and a killed upload never listed or resumed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lightning_bridge.experiment.cli._main import main
from tests._folders import (  # isolated_imports: an autouse fixture
    BASE_CONFIG,
    checkpoint_weights,
    cli_env,
    command,
    isolated_imports,  # noqa: F401
    run_in_process,
    write_folder,
)
from tests._servers import moto_server, s3_filesystem, s3_storage_section

BUCKET = "checkpoints"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        s3_filesystem(url).mkdir(BUCKET)
        yield url


def _folders(fs: Any, prefix: str) -> list[str]:
    """The checkpoint folders under a prefix of the bucket (complete or not)."""
    try:
        entries = fs.ls(f"{BUCKET}/{prefix}", detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return [e.rsplit("/", 1)[-1] for e in entries]


def _complete(fs: Any, prefix: str) -> set[str]:
    """The checkpoint folders in the bucket that hold their completion mark."""
    return {u for u in _folders(fs, prefix) if fs.exists(f"{BUCKET}/{prefix}/{u}/metadata.json")}


class S3Runs:
    def __init__(self, root: pathlib.Path, endpoint: str) -> None:
        self.root = root
        self.endpoint = endpoint
        self.workspace = root / "ws"
        config = dict(BASE_CONFIG)
        config["checkpoint_policy"] = "all"
        config["checkpoint_storage"] = s3_storage_section(
            endpoint, BUCKET, "runs", save_trial_latest=1, save_trial_best=1
        )
        self.config = write_folder(root, config)
        self.outputs: dict[str, str] = {}

    def cli(self, *args: str) -> Any:
        return main([*args, "--workspace", str(self.workspace)])

    def json(self, *args: str) -> Any:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert self.cli(*args, "--json") == 0
        return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, endpoint: str) -> Iterator[S3Runs]:
    """Experiment 1 trains 16 batches; experiment 2 is stopped by SIGTERM during batch 10 and
    continued from the bucket."""
    root = tmp_path_factory.mktemp("s3")
    previous = pathlib.Path.cwd()
    os.chdir(root)
    runs = S3Runs(root, endpoint)
    try:
        for name, argv, stop in (
            ("first", ["run", str(runs.config)], None),
            ("stopped", ["run", str(runs.config)], "10"),
            ("continued", ["experiment", "continue", "2"], None),
        ):
            runs.outputs[name] = run_in_process(runs.cli, argv, stop)
        yield runs
    finally:
        os.chdir(previous)


@pytest.mark.processes
def test_checkpoints_live_in_the_bucket_with_retention(runs: S3Runs) -> None:
    recorded = runs.json("checkpoint", "list")
    assert recorded and all(c["location"] == f"s3://{BUCKET}/runs/{c['uuid']}" for c in recorded)
    # Retention (latest 1, best 1; 'all' wrote one per validation) applied in the bucket: it
    # holds exactly the checkpoints the record lists, at most two a trial.
    fs = s3_filesystem(runs.endpoint)
    assert _complete(fs, "runs") == {c["uuid"] for c in recorded}
    for trial in (1, 2):
        assert 1 <= sum(c["trial_id"] == trial for c in recorded) <= 2
    # Nothing stays behind in the trials' folders.
    for trial_dir in (runs.workspace / "experiments").glob("*/trials/*"):
        assert not [p for p in (trial_dir / "checkpoints").iterdir() if p.is_dir()]


def test_stopped_run_continues_from_the_bucket_to_the_same_weights(runs: S3Runs) -> None:
    assert f"checkpoint s3://{BUCKET}/runs/" in runs.outputs["stopped"]
    assert "Continue with: lightning-bridge experiment continue 2" in runs.outputs["stopped"]
    logs = "\n".join(runs.json("trial", "logs", "2")["lines"])
    assert "Downloading checkpoint" in logs
    finals = []
    for experiment in (1, 2):
        (last,) = [
            c
            for c in runs.json("checkpoint", "list", "--experiment", str(experiment))
            if c["batches"] == 16
        ]
        out = runs.root / f"final-{experiment}"
        runs.json("checkpoint", "download", last["uuid"], "--out", str(out))
        finals.append(checkpoint_weights(out))
    for key, value in finals[1].items():
        torch.testing.assert_close(value, finals[0][key], rtol=0, atol=0)


@pytest.mark.processes
def test_a_killed_upload_is_never_listed_or_resumed(runs: S3Runs) -> None:
    """The run is killed (SIGKILL) while a checkpoint is on its way to the bucket: that
    checkpoint is not listed, and the continued run starts from the one before it."""
    config = dict(BASE_CONFIG)
    # A 16 MB buffer makes each upload take long enough to be caught half done.
    config["hyperparameters"] = {"global_batch_size": 8, "lr": 0.05, "ballast": 4_000_000}
    config["checkpoint_policy"] = "all"
    config["checkpoint_storage"] = s3_storage_section(runs.endpoint, BUCKET, "killed")
    folder = write_folder(runs.root, config, name="killed")
    process = subprocess.Popen(
        command("run", str(folder), "--workspace", str(runs.workspace)),
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fs = s3_filesystem(runs.endpoint)
    partial = None
    deadline = time.monotonic() + 240
    try:
        while partial is None and process.poll() is None and time.monotonic() < deadline:
            started = _folders(fs, "killed")
            complete = _complete(fs, "killed")
            pending = [u for u in started if u not in complete]
            if complete and pending:
                process.send_signal(signal.SIGKILL)
                partial = pending[0]
            else:
                time.sleep(0.01)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert partial is not None, "no upload was caught under way"
    assert fs.ls(f"{BUCKET}/killed/{partial}", refresh=True)  # some of it is there
    assert partial not in _complete(fs, "killed")

    (experiment,) = [e for e in runs.json("experiment", "list") if e["name"] == "linear"][-1:]
    listed = {
        c["uuid"] for c in runs.json("checkpoint", "list", "--experiment", str(experiment["id"]))
    }
    assert partial not in listed and len(listed) == 1
    described = runs.json("experiment", "describe", str(experiment["id"]))
    assert described["trials"][0]["state"] == "ERROR"  # its process died mid-run
    (resumed_from,) = listed

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert runs.cli("experiment", "continue", str(experiment["id"])) == 0
    trial_id = described["trials"][0]["id"]
    logs = "\n".join(runs.json("trial", "logs", str(trial_id))["lines"])
    # The killed upload's whole local copy is still in the trial's folder: `continue` finishes
    # its move (uploaded again, `metadata.json` last) and continues from it, the newest.
    assert f"Checkpoint {partial} (batch" in logs and "was written but not stored" in logs
    assert f"Continuing from checkpoint {runs.workspace}" in logs
    continued = [line for line in logs.splitlines() if "Continuing from checkpoint" in line]
    assert partial in continued[-1] and resumed_from not in continued[-1]
    final = runs.json("experiment", "describe", str(experiment["id"]))
    assert final["trials"][0]["state"] == "COMPLETED"
    assert final["trials"][0]["batches_trained"] == 16
    kept = {c["uuid"] for c in final["checkpoints"]}
    assert kept == set(_complete(fs, "killed"))  # every stored checkpoint complete and listed
