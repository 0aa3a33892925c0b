"""Determined 0.38.1's own Core API tutorials run unchanged through `lightning-bridge run`, with
their own configs, and the record shows what they report: `examples/tutorials/core_api/`
(stages 0 to 3) and `examples/tutorials/core_api_pytorch_mnist/` (made-up data of MNIST's
shape from a stand-in `torchvision`, see tests/fixtures/determined_examples/README.md)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from tests._folders import cli_env, command

pytestmark = pytest.mark.processes

EXAMPLES = pathlib.Path(__file__).resolve().parent / "fixtures" / "determined_examples"
STANDIN = pathlib.Path(__file__).resolve().parent / "fixtures" / "torchvision_standin"


def run_example(tmp_path: pathlib.Path, folder: str, config: str, *args: str) -> tuple[str, dict]:
    """`lightning-bridge run CONFIG .` in a copy of the example folder: what it printed, and
    the experiment as `experiment describe --json` shows it."""
    work = tmp_path / folder
    shutil.copytree(EXAMPLES / folder, work)
    ws = tmp_path / "ws"
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), env["PYTHONPATH"]])
    done = subprocess.run(
        command("run", config, ".", "--workspace", str(ws), *args),
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    shown = subprocess.run(
        command("experiment", "describe", "1", "--json", "--workspace", str(ws)),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    return done.stdout + done.stderr, json.loads(shown.stdout)


def test_stage_0_a_plain_script_runs_as_a_trial(tmp_path: pathlib.Path) -> None:
    printed, data = run_example(tmp_path, "core_api", "0_start.yaml")
    assert data["trials"][0]["state"] == "COMPLETED"
    assert "x is now 100" in printed


def test_stage_1_metrics_reach_the_record(tmp_path: pathlib.Path) -> None:
    _, data = run_example(tmp_path, "core_api", "1_metrics.yaml")
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED"
    assert [(m["batches"], m["values"]) for m in trial["training"]] == [
        (n, {"x": n}) for n in range(10, 101, 10)
    ]
    assert [(m["batches"], m["values"]) for m in trial["validation"]] == [(100, {"x": 100})]


def test_stage_2_checkpoints_are_stored_with_retention(tmp_path: pathlib.Path) -> None:
    _, data = run_example(tmp_path, "core_api", "2_checkpoints.yaml")
    assert data["trials"][0]["state"] == "COMPLETED"
    # Ten checkpoints were written; the default retention keeps the latest (no validation
    # came with any of them, so there is no best to keep besides).
    (kept,) = data["checkpoints"]
    assert kept["batches"] == 100
    state = (pathlib.Path(kept["location"]) / "state").read_text()
    assert state == "100,100,1"


def test_stage_3_an_adaptive_asha_search_of_the_script(tmp_path: pathlib.Path) -> None:
    # The config's own search with 4 trials instead of 10: a bracket of two rungs (25 and 100
    # batches) with 3 trials and one of a single rung with 1 (as for 10 trials: two rungs,
    # two brackets). The seed draws increment_by 2, 5 and 7 for the first bracket: the trial
    # of 7 reports its rung after a better one whichever trials run first, and is stopped.
    _, data = run_example(
        tmp_path,
        "core_api",
        "3_hpsearch.yaml",
        "--set",
        "searcher.max_trials=4",
        "--set",
        "reproducibility.experiment_seed=1",
    )
    trials = data["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}
    lengths = {
        t["hparams"]["increment_by"]: max(m["batches"] for m in t["validation"]) for t in trials
    }
    # ASHA stopped a trial at a rung short of max_time (100 batches) through should_preempt();
    # others trained to it.
    assert lengths[7] < 100 and max(lengths.values()) == 100, lengths


def test_mnist_const_metrics_and_checkpoints(tmp_path: pathlib.Path) -> None:
    for config in ("const.yaml", "metrics.yaml", "checkpoints.yaml"):
        _, data = run_example(tmp_path / config, "core_api_pytorch_mnist", config)
        (trial,) = data["trials"]
        assert trial["state"] == "COMPLETED", (config, trial)
        if config == "const.yaml":
            continue
        # 14 epochs of 2 batches (128 made-up images, batches of 64), a test pass each epoch.
        assert [m["batches"] for m in trial["validation"]] == list(range(2, 29, 2)), config
        assert all(m["values"]["test_loss"] > 0 for m in trial["validation"])
        if config == "checkpoints.yaml":
            assert [c["batches"] for c in data["checkpoints"]][-1] == 28


def test_mnist_adaptive_search(tmp_path: pathlib.Path) -> None:
    # The config's own search, with fewer trials than its 50 to keep the run short.
    _, data = run_example(
        tmp_path, "core_api_pytorch_mnist", "adaptive.yaml", "--set", "searcher.max_trials=4"
    )
    trials = data["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}
    # Each trial reported a test pass per epoch until the search stopped it or it reached
    # max_time (which of the 4 random configurations ASHA stops depends on their draw and
    # bracket: the stop itself is checked with stage 3 and in test_core_api_run.py).
    for t in trials:
        epochs = [m["values"]["epochs"] for m in t["validation"]]
        assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) <= 20, epochs
    assert max(len(t["validation"]) for t in trials) == 20


def test_stage_4_a_script_that_starts_its_own_workers(tmp_path: pathlib.Path) -> None:
    """`python3 4_distributed.py launcher` runs once on its node, as Determined runs a command
    not behind its launcher; it starts `slot_ids` workers itself through
    `determined.launch.wrap_rank`, each building its DistributedContext from the cluster info
    (`chief_ip`); the chief reports what the 8 workers sum."""
    printed, data = run_example(tmp_path, "core_api", "4_distributed.yaml", "--force")
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED"
    (hparams,) = [trial["hparams"]]
    increment = hparams["increment_by"]
    assert [(m["batches"], m["values"]) for m in trial["validation"]] == [
        (n, {"x": 8 * increment * n}) for n in range(10, 101, 10)
    ]
    assert "[rank=0] " in printed and "[rank=7] " in printed
    assert data["checkpoints"][-1]["batches"] == 100
