"""The bridge's `determined.transformers.DetCallback` against Determined 0.38.1's own on the
same Trainer script (`HF_TRAIN`): the reports, in order, with their values, the checkpoint
folders and their metadata, the final weights. Determined's runs off-cluster
(`DET_OFFCLUSTER`: its callback with a trial's `ClusterInfo` and its off-cluster Core API);
the bridge's under `lightning-bridge run`. Needs transformers and determined==0.38.1 in one
environment (the `interop` session installs the `[transformers]` extra beside determined)."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml

from tests._folders import cli_env, command, workspace
from tests._hf_runs import DET_OFFCLUSTER, hf_folder

pytestmark = pytest.mark.interop

_REPORT = re.compile(r"report_metrics\(group=(\w+), steps_completed=(\d+), metrics=(\{.*\})\)$")


def report_lines(text: str) -> list[tuple[str, int, dict[str, Any]]]:
    """The `report_metrics(...)` lines of a run's log: group, step and metrics."""
    found = []
    for line in text.splitlines():
        match = _REPORT.search(line)
        if match:
            found.append((match[1], int(match[2]), ast.literal_eval(match[3])))
    return found


def checkpoint_files(folder: pathlib.Path) -> list[str]:
    """A stored checkpoint's files; TensorBoard's event files (named after the host and the
    time) by their folder."""
    return sorted(
        "runs/<events>" if p.name.startswith("events.out") else p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != "metadata.json"
    )


def run_determined(folder: pathlib.Path, tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """`DET_OFFCLUSTER` on the folder's script, its entrypoint's arguments, with the installed
    determined; its output and its checkpoint storage."""
    config = yaml.safe_load((folder / "const.yaml").read_text())
    args = config["entrypoint"].split()[2:]
    storage = tmp_path / "det-storage"
    runs = tmp_path / "det-run"
    runs.mkdir()
    (folder / "det_offcluster.py").write_text(DET_OFFCLUSTER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "LIGHTNING_BRIDGE"))}
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])
    env["HF_PARITY_INFO"] = json.dumps(
        {"hparams": config["hyperparameters"], "config": config, "storage": str(storage)}
    )
    # HF_TRAIN writes what it saw beside the experiment file the bridge names.
    env["LIGHTNING_BRIDGE_EXPERIMENT"] = str(runs / "experiment.json")
    done = subprocess.run(
        [sys.executable, "det_offcluster.py", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr, storage


def test_the_bridges_detcallback_reports_and_stores_what_determineds_does(
    tmp_path: pathlib.Path,
) -> None:
    import determined

    assert determined.__version__ == "0.38.1"
    hparams = {"user_data": {"dataset": "tokens"}}
    theirs_folder = hf_folder(tmp_path, "theirs", hyperparameters=hparams)
    their_log, their_storage = run_determined(theirs_folder, tmp_path)

    ours_folder = hf_folder(
        tmp_path,
        "ours",
        hyperparameters=hparams,
        checkpoint_storage={"save_trial_latest": 10, "save_trial_best": 0},
    )
    done = subprocess.run(
        command("run", "const.yaml", "--workspace", str(workspace(ours_folder))),
        cwd=ours_folder,
        env=cli_env(ours_folder),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trial_dir = workspace(ours_folder) / "experiments" / "1" / "trials" / "1"
    our_log = done.stdout + done.stderr  # a single trial's output is the command's

    # The same reports, in the same order, groups, steps and metric names; the values of one
    # training on the same CPU, to float rounding.
    ours, theirs = report_lines(our_log), report_lines(their_log)
    assert [(g, s, sorted(m)) for g, s, m in ours] == [(g, s, sorted(m)) for g, s, m in theirs]
    assert [(g, s) for g, s, _ in ours] == [
        ("training", 4),
        ("validation", 4),
        ("training", 8),
        ("validation", 8),
        ("training", 12),
        ("validation", 12),
    ]
    for (_, _, a), (_, _, b) in zip(ours, theirs, strict=True):
        assert a == pytest.approx(b, rel=1e-5), (a, b)

    # A checkpoint per save (4, 8, 12), with the same files and metadata.
    their_checkpoints = sorted(
        (p for p in their_storage.iterdir() if p.is_dir()),
        key=lambda p: json.loads((p / "metadata.json").read_text())["steps_completed"],
    )
    with_metadata = [json.loads((p / "metadata.json").read_text()) for p in their_checkpoints]
    assert [m["steps_completed"] for m in with_metadata] == [4, 8, 12]
    with subprocess.Popen(
        command(
            "experiment", "describe", "1", "--json", "--workspace", str(workspace(ours_folder))
        ),
        cwd=ours_folder,
        env=cli_env(ours_folder),
        stdout=subprocess.PIPE,
        text=True,
    ) as described:
        out, _ = described.communicate(timeout=300)
    our_checkpoints = [pathlib.Path(c["location"]) for c in json.loads(out)["checkpoints"]]
    assert len(our_checkpoints) == 3
    for ours_at, theirs_at in zip(our_checkpoints, their_checkpoints, strict=True):
        assert checkpoint_files(ours_at) == checkpoint_files(theirs_at)
        our_meta = json.loads((ours_at / "metadata.json").read_text())
        their_meta = json.loads((theirs_at / "metadata.json").read_text())
        assert our_meta == {k: their_meta[k] for k in ("steps_completed", "trial_id")}, (
            our_meta,
            their_meta,
        )

    # The same final weights.
    a = torch.load(trial_dir / "weights.0.pt")
    b = torch.load(tmp_path / "det-run" / "weights.0.pt")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
