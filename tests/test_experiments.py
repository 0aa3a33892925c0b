"""The experiment record through the command line: two runs of one folder (one stopped by
SIGTERM and continued), then every record command on them, as a user would type them."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lightning_bridge.experiment.cli._main import main
from lightning_bridge.record._registry import Registry
from tests._folders import (  # isolated_imports: an autouse fixture
    SEED_7,
    Gate,
    checkpoint_weights,
    cli_env,
    command,
    fault_folder,
    finish,
    isolated_imports,  # noqa: F401
    kept_checkpoints,
    run_in_process,
    start,
    start_run,
    steps_completed,
    wait_for,
    workspace,
    write_folder,
)


class Runs:
    """What the module's runs left: the workspace, the folder and the outputs."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.workspace = root / "ws"
        self.config = write_folder(root)
        self.outputs: dict[str, str] = {}

    def cli(self, *args: str) -> Any:
        return main([*args, "--workspace", str(self.workspace)])


def _json(capsys: pytest.CaptureFixture[str], runs: Runs, *args: str) -> Any:
    capsys.readouterr()
    assert runs.cli(*args, "--json") == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Experiment 1 trains 16 batches; experiment 2 is stopped by SIGTERM during batch 10 and
    continued with `experiment continue 2`."""
    root = tmp_path_factory.mktemp("experiments")
    previous = pathlib.Path.cwd()
    os.chdir(root)
    runs = Runs(root)
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


def test_a_signal_stop_prints_the_cli_continue_command(runs: Runs) -> None:
    stopped = runs.outputs["stopped"]
    assert "Stopped by SIGTERM after batch 11" in stopped
    assert (
        f"Continue with: lightning-bridge experiment continue 2 --workspace {runs.workspace}"
        in stopped
    )
    assert "fit(latest_checkpoint=" not in stopped
    assert "Experiment 2" in runs.outputs["continued"]


def test_continue_ends_bit_exact(runs: Runs) -> None:
    first = kept_checkpoints(1, runs.workspace)[-1]
    continued = kept_checkpoints(2, runs.workspace)[-1]
    assert steps_completed(first) == steps_completed(continued) == 16
    want = checkpoint_weights(first)
    for key, value in checkpoint_weights(continued).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0)


def test_list_and_describe(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    listed = _json(capsys, runs, "experiment", "list")
    assert [(e["id"], e["name"], e["state"], e["trials"]) for e in listed] == [
        (1, "linear", "COMPLETED", 1),
        (2, "linear", "COMPLETED", 1),
    ]
    capsys.readouterr()
    assert runs.cli("experiment", "list") == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == [
        "ID", "Name", "State", "Trials", "Best", "validation", "Created", "Config",
    ]  # fmt: skip

    one, two = (_json(capsys, runs, "experiment", "describe", str(i)) for i in (1, 2))
    (trial,) = two["trials"]
    assert trial["state"] == "COMPLETED" and trial["runs"] == 2
    assert trial["hparams"] == {"global_batch_size": 8, "lr": 0.05} and trial["seed"] == SEED_7
    assert trial["batches_trained"] == 16 and trial["epochs_trained"] == 2
    assert trial["start_time"] < trial["end_time"]
    # Every validation (every 4 batches) recorded by the trial's process, the continued
    # run's the same numbers as the uninterrupted one's.
    values = [(m["batches"], m["values"]["validation_loss"]) for m in trial["validation"]]
    assert [b for b, _ in values] == [4, 8, 12, 16]
    assert values == [
        (m["batches"], m["values"]["validation_loss"]) for m in one["trials"][0]["validation"]
    ]
    assert [m["batches"] for m in trial["training"]] == [4, 8, 11, 12, 16]
    best = two["best_checkpoint"]
    assert best["batches"] == 16 and best["metrics"]["validation_loss"] == values[-1][1]
    assert {c["uuid"] for c in two["checkpoints"]} == {best["uuid"]}
    assert pathlib.Path(trial["log_file"]).is_file()

    capsys.readouterr()
    assert runs.cli("experiment", "describe", "2") == 0
    text = capsys.readouterr().out
    assert "Experiment 2: linear  [COMPLETED]" in text
    assert f"Best checkpoint: {best['uuid']} (batch 16" in text


def test_trial_logs(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    logs = _json(capsys, runs, "trial", "logs", "2")["lines"]
    text = "\n".join(logs)
    assert "Experiment 2, trial 2: model_def:LinearTrial" in text
    assert "Continuing from checkpoint" in text
    assert " INFO lightning_bridge: Checkpoint " in text  # the file format: time, level, name
    capsys.readouterr()
    assert runs.cli("trial", "logs", "2", "--tail", "1") == 0
    assert capsys.readouterr().out.strip() == logs[-1]


def test_checkpoint_list_and_download(
    runs: Runs, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    every = _json(capsys, runs, "checkpoint", "list")
    best = _json(capsys, runs, "checkpoint", "list", "--best")
    assert [c["experiment_id"] for c in best] == [1, 2]
    assert all(c in every for c in best)
    assert all("validation_loss" in c["metrics"] for c in best)
    out = tmp_path / "downloaded"
    got = _json(capsys, runs, "checkpoint", "download", best[1]["uuid"], "--out", str(out))
    assert got["downloaded_to"] == str(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "code", "load_data.json", "metadata.json", "state_dict.pth", "trial_state.pkl",
    ]  # fmt: skip
    assert (out / "code" / "model_def.py").is_file()  # the experiment folder rides along
    want = checkpoint_weights(kept_checkpoints(2, runs.workspace)[-1])
    for key, value in checkpoint_weights(out).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0)
    capsys.readouterr()
    assert runs.cli("checkpoint", "download", "no-such-uuid", "--out", str(tmp_path / "x")) == 2
    assert "checkpoint no-such-uuid is not in the workspace" in capsys.readouterr().err


def test_plot_draws_the_curves(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib.image

    png = runs.root / "curves.png"
    assert _json(capsys, runs, "experiment", "plot", "2", "--out", str(png))["png"] == str(png)
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 200 and image.shape[1] > 600  # two panels side by side
    # The lines are drawn in matplotlib's first colour (#1f77b4): many pixels of it.
    blue = (abs(image[..., 0] - 0x1F / 255) < 0.05) & (abs(image[..., 2] - 0xB4 / 255) < 0.05)
    assert blue.sum() > 300


def test_resume_latest_on_a_finished_trial_says_it_is_complete(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert runs.cli("run", str(runs.config), "--resume", "latest") == 0
    out = capsys.readouterr().out
    assert "trial 2 of experiment 2 is complete" in out
    assert "raise searcher.max_length" in out
    assert len(_json(capsys, runs, "experiment", "list")) == 2  # no experiment started
    assert runs.cli("experiment", "continue", "2") == 0
    assert "Experiment 2 is complete" in capsys.readouterr().out


def test_unknown_ids_exit_2(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    assert runs.cli("experiment", "describe", "99") == 2
    assert "experiment 99 not found in the workspace" in capsys.readouterr().err
    assert runs.cli("trial", "logs", "99") == 2
    assert "trial 99 not found" in capsys.readouterr().err


@pytest.mark.processes
def test_pause_then_kill_reach_a_trial_training_on_this_machine(tmp_path: pathlib.Path) -> None:
    """`experiment pause` of a run training on this machine stops its trial's process after a
    checkpoint (the run exits 0, the trial STOPPED part way); `experiment kill` of its
    continuation ends that process at once, the trial recorded STOPPED, killed there."""
    gate = Gate.at(tmp_path / "gate")  # held after 3 batches, and again after 12
    folder = fault_folder(tmp_path, hyperparameters=gate.hparams([3, 12]))
    ws = workspace(folder)

    def lb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command(*args, "--workspace", str(ws)),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def trial() -> Any:
        with Registry(ws) as registry:
            return registry.trial(1)

    run = start_run(folder)
    wait_for(gate.reached, run)
    # `experiment describe` says where the trial runs, as its launcher's handle reaches it.
    described = lb("experiment", "describe", "1")
    assert described.returncode == 0, described.stdout + described.stderr
    host = socket.gethostname()
    assert f"trial 1: runs now: process {trial().pid} on {host}, running" in described.stdout
    paused = lb("experiment", "pause", "1")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    code, out, err, _ = finish(run, 180)
    assert code == 0, out + err
    stopped = trial()
    assert stopped.state == "STOPPED" and 3 <= stopped.batches_trained < 40, stopped
    assert f"Trial 1 (process {stopped.pid}): checkpoints and stops" in paused.stdout
    assert "runs now" not in lb("experiment", "describe", "1").stdout

    continuing = ["experiment", "continue", "1", "--workspace", str(ws)]
    continued = start(continuing, folder, tmp_path / "log")
    wait_for(lambda: gate.reached() == 2, continued, 180)  # on, to its second hold
    killed = lb("experiment", "kill", "1")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    continued.wait(60)
    assert continued.returncode == -signal.SIGKILL
    ended = trial()
    assert ended.state == "STOPPED" and ended.batches_trained < 40, ended
    assert ended.message == f"killed (process {ended.pid})", ended
