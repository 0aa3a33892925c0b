"""Determined 0.38.1's own `examples/hf_trainer_api/hf_language_modeling` (`run_clm.py` with
`DetCallback`) runs unchanged through `lightning-bridge run`: `const.yaml`, `adaptive.yaml`
(an ASHA search) and `distributed.yaml` (two processes behind Determined's torch_distributed
launcher). The example needs transformers < 4.46 (`is_torch_tpu_available`,
`--evaluation_strategy`), `datasets` and `evaluate`: the `transformers_legacy` session installs
them (marker `transformers_legacy`).

No download: `gpt2`, `wikitext` and the `accuracy` metric are local folders beside the example
(tests/_hf_standins.py) that Hugging Face's loaders find before the Hub, all of them offline.
The example writes to `--output_dir /tmp/test-clm`, a folder of its own on each Determined
container; on one machine every trial would meet there, so the runs point it into the trial's
working folder through the example's own `training_arguments` hyperparameters (appended to the
command line by `run_clm.py`)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest

from tests._folders import cli_env, command

pytestmark = pytest.mark.transformers_legacy

EXAMPLE = (
    pathlib.Path(__file__).resolve().parent
    / "fixtures"
    / "determined_examples"
    / "hf_language_modeling"
)
# The trial's own folder for the Trainer's output (see the module docstring).
OUTPUT = "hyperparameters.training_arguments.output_dir=test-clm"
CPU = "hyperparameters.training_arguments.use_cpu=true"


def run_example(tmp_path: pathlib.Path, config: str, *args: str) -> tuple[pathlib.Path, dict]:
    """`lightning-bridge run CONFIG .` in a copy of the example with the stand-ins beside it:
    the workspace, and the experiment as `experiment describe --json` shows it."""
    from tests._hf_standins import offline_env, write_standins

    work = tmp_path / "hf_language_modeling"
    shutil.copytree(EXAMPLE, work)
    write_standins(work)
    ws = tmp_path / "ws"
    env = {**cli_env(), **offline_env(tmp_path)}
    done = subprocess.run(
        command("run", config, ".", "--workspace", str(ws), "--set", OUTPUT, *args),
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    shown = subprocess.run(
        command("experiment", "describe", "1", "--json", "--workspace", str(ws)),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    return ws, json.loads(shown.stdout)


USER_DATA = {
    "finetuned_from": "gpt2",
    "tasks": "language-modeling",
    "dataset": "wikitext",
    "tags": ["language-modeling", "nlp"],
}


def check_trial_to_the_end(trial: dict[str, Any]) -> None:
    """100 steps: a log and an evaluation every 10 (the example's `eval_accuracy` too)."""
    assert trial["state"] == "COMPLETED", trial
    assert [m["batches"] for m in trial["training"]] == list(range(10, 101, 10))
    assert all("loss" in m["values"] for m in trial["training"])
    assert [m["batches"] for m in trial["validation"]] == list(range(10, 101, 10))
    for m in trial["validation"]:
        assert {"eval_loss", "eval_accuracy"} <= set(m["values"]), m


def check_checkpoint(kept: dict[str, Any], step: int) -> None:
    """The Trainer's folder of that step as stored, with the example's `user_data`."""
    where = pathlib.Path(kept["location"])
    folder = where / f"checkpoint-{step}"
    assert {"model.safetensors", "trainer_state.json", "optimizer.pt"} <= {
        p.name for p in folder.iterdir()
    }
    assert json.loads((folder / "my_data.json").read_text()) == USER_DATA
    assert json.loads((where / "metadata.json").read_text())["steps_completed"] == step


def test_const(tmp_path: pathlib.Path) -> None:
    _, data = run_example(tmp_path, "const.yaml")
    (trial,) = data["trials"]
    check_trial_to_the_end(trial)
    losses = [m["values"]["eval_loss"] for m in trial["validation"]]
    assert losses[-1] < losses[0], losses
    # One process of 8 sequences a step: an epoch of the 209 stand-in blocks is 27 steps.
    assert trial["validation"][-1]["values"]["epochs"] == pytest.approx(100 / 27)
    # Determined's default retention: the latest and the best (here the same, step 100).
    (kept,) = data["checkpoints"]
    assert kept["batches"] == 100
    check_checkpoint(kept, 100)


def test_distributed_two_processes(tmp_path: pathlib.Path) -> None:
    # On a machine without a GPU, transformers makes a world of CPU processes only when told
    # to use the CPU (else each process trains alone): the example's own hyperparameters.
    _, data = run_example(tmp_path, "distributed.yaml", "--set", CPU)
    (trial,) = data["trials"]
    check_trial_to_the_end(trial)
    # Two processes of 8 sequences a step: an epoch of the 209 stand-in blocks takes 14 steps
    # (27 for one process), which the Trainer's `epoch` shows.
    epochs = [m["values"]["epochs"] for m in trial["validation"]]
    assert epochs[-1] == pytest.approx(100 / 14), epochs
    (kept,) = data["checkpoints"]
    check_checkpoint(kept, 100)


def test_adaptive_asha_stops_trials(tmp_path: pathlib.Path) -> None:
    # The config's own search, smaller: 4 trials instead of 64 (two brackets, one of rungs at
    # 10 and 40 batches), 40 steps instead of 100 (the Trainer's `--max_steps` through the
    # example's hyperparameters, and the searcher's max_time, which DetCallback checks against
    # it), one process a trial (distributed.yaml's test runs two), from a fixed seed.
    _, data = run_example(
        tmp_path,
        "adaptive.yaml",
        "--set",
        "resources.slots_per_trial=1",
        "--set",
        "hyperparameters.training_arguments.max_steps=40",
        "--set",
        "searcher.max_time=40",
        "--set",
        "searcher.max_trials=4",
        "--set",
        "searcher.max_concurrent_trials=1",
        "--set",
        "reproducibility.experiment_seed=1",
    )
    trials = data["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}, trials
    lengths = {t["id"]: max(m["batches"] for m in t["validation"]) for t in trials}
    print(f"adaptive: the trials' last validations {lengths}")
    # ASHA stopped a trial at a rung short of max_time (40 batches) through should_preempt();
    # others trained to it.
    assert min(lengths.values()) < 40 and max(lengths.values()) == 40, lengths
    for t in trials:
        rates = t["hparams"]["training_arguments"]
        assert 1e-5 <= rates["learning_rate"] <= 1e-2 and 1e-10 <= rates["adam_epsilon"] <= 1e-7
