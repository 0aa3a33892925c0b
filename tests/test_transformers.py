"""Hugging Face's `transformers.Trainer` with Determined's `DetCallback` under `lightning-bridge
run`: metrics reach the record and TensorBoard, the Trainer's checkpoint folders reach storage
with retention, a pause continues from the uploaded checkpoint, an ASHA search stops trials,
two processes train under Determined's torch_distributed launcher, and the searcher's length
is checked against the Trainer's. A tiny GPT-2 from a config, pre-tokenized data: no download.

All but the first test need transformers (the `[transformers]` extra): they are marked
`transformers` and run in that session."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch

from lightning_bridge.contract import _import_map
from tests import _core_api_runs
from tests._core_api_runs import seen_runs
from tests._folders import Gate, cli_env, finish, start_run, wait_for, workspace
from tests._hf_runs import hf_folder


def lb(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`lightning-bridge ARGS` on the folder's workspace: a Trainer run gets 600 s."""
    return _core_api_runs.lb(folder, *args, timeout=600)


def described(folder: pathlib.Path, experiment: int = 1) -> dict[str, Any]:
    return _core_api_runs.described(folder, experiment, timeout=600)


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is not None, reason="transformers is installed"
)
def test_without_transformers_the_import_names_the_extra() -> None:
    _import_map.install(force=True)
    try:
        with pytest.raises(ImportError) as info:
            exec("from determined.transformers import DetCallback", {})
    finally:
        _import_map.uninstall()
    assert "pip install 'lightning-bridge[transformers]'" in str(info.value), info.value


@pytest.mark.transformers
def test_the_module_answers_with_determineds_names_and_rules() -> None:
    _import_map.install(force=True)
    try:
        import determined.transformers as det_transformers
        from determined.transformers import DetCallback
    finally:
        _import_map.uninstall()
    import transformers

    assert issubclass(DetCallback, transformers.TrainerCallback)
    assert sorted(det_transformers.__all__) == [
        "DetCallback",
        "get_ds_config_path_from_args",
        "get_metric_type",
    ]
    get_metric_type = det_transformers.get_metric_type
    assert get_metric_type({"loss": 1.0, "epoch": 0.5}) == "train_"
    assert get_metric_type({"eval_loss": 1.0, "test_loss": 2.0}) == "eval_"
    assert get_metric_type({"test_loss": 2.0, "epoch": 1}) == "test_"
    get_path = det_transformers.get_ds_config_path_from_args
    assert get_path(["--deepspeed", "ds_configs/ds_config_stage_1.json", "--do_train"]) == (
        "ds_configs/ds_config_stage_1.json"
    )
    assert get_path(["--do_train"]) is None
    with pytest.raises(ValueError, match="give the DeepSpeed config path"):
        get_path(["--do_train", "--deepspeed"])


@pytest.mark.transformers
def test_detcallback_outside_a_trial_says_how_to_run_it(tmp_path: pathlib.Path) -> None:
    """Run directly (no `lightning-bridge run`), the callback refuses with the command to use."""
    script = tmp_path / "direct.py"
    script.write_text(
        "import transformers\n"
        "import determined as det\n"
        "from determined.transformers import DetCallback\n"
        "args = transformers.TrainingArguments(output_dir='out', use_cpu=True)\n"
        "with det.core.init() as core_context:\n"
        "    DetCallback(core_context, args)\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(_import_map.shim_dir(tmp_path)), env["PYTHONPATH"]])
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DetCallback needs a trial: run the script with `lightning-bridge run" in done.stderr, (
        done.stderr[-3000:]
    )


def run_dir(folder: pathlib.Path, trial: int = 1) -> pathlib.Path:
    return workspace(folder) / "experiments" / "1" / "trials" / str(trial)


def weights(folder: pathlib.Path, n: int, trial: int = 1) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(run_dir(folder, trial) / f"weights.{n}.pt")
    return state


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# The record keeps a training report's batches and epochs as its position, not its values.
TRAINING = ["grad_norm", "learning_rate", "loss"]


@pytest.mark.transformers
def test_metrics_and_checkpoints_reach_the_record(tmp_path: pathlib.Path) -> None:
    folder = hf_folder(
        tmp_path,
        hyperparameters={"user_data": {"dataset": "tokens"}},
        checkpoint_storage={"save_trial_latest": 2, "save_trial_best": 0},
    )
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = described(folder)
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED", trial
    # The Trainer's logs every 4 steps, by their type (the closing `train_loss` average at
    # step 12 is not reported twice), without `epoch` and the speed metrics.
    assert [m["batches"] for m in trial["training"]] == [4, 8, 12]
    assert [sorted(m["values"]) for m in trial["training"]] == [TRAINING] * 3
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    assert [sorted(m["values"]) for m in trial["validation"]] == [
        ["batches", "epochs", "eval_loss"]
    ] * 3
    assert [m["values"]["epochs"] for m in trial["validation"]] == [0.5, 1.0, 1.5]
    # Every save uploaded the Trainer's checkpoint folder and runs/; the retention of the
    # config kept the latest two.
    kept = data["checkpoints"]
    assert [c["batches"] for c in kept] == [8, 12]
    for checkpoint, step in zip(kept, (8, 12), strict=True):
        where = pathlib.Path(checkpoint["location"])
        assert sorted(p.name for p in where.iterdir()) == [
            f"checkpoint-{step}",
            "metadata.json",
            "runs",
        ]
        inside = {p.name for p in (where / f"checkpoint-{step}").iterdir()}
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= inside, inside
        assert json.loads((where / "metadata.json").read_text()) == {
            "steps_completed": step,
            "trial_id": 1,
        }
        assert json.loads((where / f"checkpoint-{step}" / "my_data.json").read_text()) == {
            "dataset": "tokens"
        }
        state = json.loads((where / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert state["global_step"] == step
    # The reports are in the trial's TensorBoard folder.
    assert list((run_dir(folder) / "tensorboard").rglob("events.out.tfevents*"))


@pytest.mark.transformers
def test_filter_metrics_keeps_the_named_ones_and_the_searchers(tmp_path: pathlib.Path) -> None:
    folder = hf_folder(tmp_path, hyperparameters={"filter_metrics": ["grad_norm"]})
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = described(folder)["trials"]
    assert [sorted(m["values"]) for m in trial["training"]] == [["grad_norm"]] * 3
    assert [sorted(m["values"]) for m in trial["validation"]] == [
        ["batches", "epochs", "eval_loss"]
    ] * 3


@pytest.mark.transformers
def test_paused_and_continued_the_trainer_resumes_from_the_uploaded_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    plain = hf_folder(tmp_path, "plain")
    done = lb(plain, "run", "const.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    gate = Gate.at(tmp_path / "gate")  # held before step 6 (5 trained)
    out = tmp_path / "paused-out"
    folder = hf_folder(tmp_path, "paused", output_dir=out, hyperparameters=gate.hparams(5))
    run = start_run(folder)
    wait_for(gate.reached, run)
    paused = lb(folder, "experiment", "pause", "1")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    code, stdout, stderr, _ = finish(run, 300)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    trial = described(folder)["trials"][0]
    assert trial["state"] == "STOPPED", trial
    (stopped,) = seen_runs(run_dir(folder))
    # Asked to stop at step 5, the Trainer stopped at its next log (step 8) and saved there.
    assert stopped == {**stopped, "resumed_from": None, "global_step": 8}
    assert [c["batches"] for c in described(folder)["checkpoints"]] == [8]

    # The continued trial starts elsewhere, as on a new node: nothing of the Trainer's folder.
    shutil.rmtree(out)
    gate.release()
    continued = lb(folder, "experiment", "continue", "1")
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-3000:]
    trial = described(folder)["trials"][0]
    assert trial["state"] == "COMPLETED", trial
    _, resumed = seen_runs(run_dir(folder))
    # DetCallback downloaded the checkpoint and the Trainer resumed from its step.
    assert resumed["resumed_from"] == "checkpoint-8" and resumed["global_step"] == 12
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    # The same weights as the uninterrupted run's, within float rounding (HF restores the
    # model, optimizer, scheduler and RNG states; the data order of the resumed epoch is
    # replayed by skipping batches).
    difference = max_difference(weights(folder, 1), weights(plain, 0))
    print(f"pause / continue: largest weight difference to the uninterrupted run {difference}")
    assert difference < 1e-5, difference
    plain_trial = described(plain)["trials"][0]
    for ours, theirs in zip(trial["validation"], plain_trial["validation"], strict=True):
        assert ours["values"]["eval_loss"] == pytest.approx(theirs["values"]["eval_loss"], 1e-5)


@pytest.mark.transformers
def test_an_adaptive_asha_search_stops_trials_at_their_rung(tmp_path: pathlib.Path) -> None:
    """ASHA ranks a trial at each rung on its `eval_loss`; a trial it stops sees
    should_preempt() at that log, saves and ends (COMPLETED), as on Determined."""
    folder = hf_folder(
        tmp_path,
        args=["--max_steps", "16"],
        hyperparameters={"learning_rate": {"type": "categorical", "vals": [0.01, 1e-5, 1e-6]}},
        reproducibility={"experiment_seed": 7},
        searcher={
            "name": "adaptive_asha",
            "metric": "eval_loss",
            "smaller_is_better": True,
            "time_metric": "batches",
            "max_time": 16,
            "max_trials": 4,
            "max_concurrent_trials": 1,
            "mode": "aggressive",
            "max_rungs": 2,
            "divisor": 4,
        },
    )
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = described(folder)["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}, trials
    ended, best = [], float("inf")
    for t in sorted(trials, key=lambda t: t["id"]):
        (seen,) = seen_runs(run_dir(folder, t["id"]))
        ended.append(seen["global_step"])
        assert [m["batches"] for m in t["validation"]] == list(range(4, seen["global_step"] + 1, 4))
        # Determined's rule with 4 trials a rung: a trial goes on from the first rung (4
        # batches) to max_time only when no trial before it did better there.
        rung = t["validation"][0]["values"]["eval_loss"]
        assert seen["global_step"] == (16 if rung <= best else 4), (t, best)
        best = min(best, rung)
    assert 4 in ended and ended[0] == 16, ended


@pytest.mark.transformers
def test_two_processes_under_the_torch_distributed_launcher(tmp_path: pathlib.Path) -> None:
    folder = hf_folder(
        tmp_path,
        launcher="python3 -m determined.launch.torch_distributed",
        args=["--per_device_train_batch_size", "4", "--ddp_backend", "gloo"],
        resources={"slots_per_trial": 2},
    )
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = described(folder)["trials"]
    assert trial["state"] == "COMPLETED", trial
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    assert [s["global_step"] for s in seen_runs(run_dir(folder), 1)] == [12]
    (kept,) = described(folder)["checkpoints"]
    where = pathlib.Path(kept["location"])
    assert (where / "checkpoint-12" / "model.safetensors").is_file()


@pytest.mark.transformers
@pytest.mark.parametrize(
    ("searcher", "says"),
    [
        (
            {"max_length": {"batches": 10}},
            "The Trainer trains batches=12 (--max_steps) but searcher.max_length is batches=10",
        ),
        ({"max_length": 12}, "searcher.max_length without a unit"),
        (
            {
                "name": "adaptive_asha",
                "time_metric": "batches",
                "max_time": 20,
                "max_trials": 1,
            },
            "the adaptive_asha searcher's max_time is batches=20",
        ),
    ],
    ids=["max_length", "unitless", "asha"],
)
def test_a_searcher_length_unlike_the_trainers_fails_before_training(
    tmp_path: pathlib.Path, searcher: dict[str, Any], says: str
) -> None:
    folder = hf_folder(tmp_path, searcher={"name": "single", "metric": "eval_loss", **searcher})
    done = lb(folder, "run", "const.yaml")
    log = "\n".join(p.read_text() for p in workspace(folder).rglob("*.log"))
    assert says in done.stdout + done.stderr + log, done.stdout[-3000:] + log[-3000:]
    (trial,) = described(folder)["trials"]
    assert trial["state"] in ("ERROR", "COMPLETED") and trial["validation"] == [], trial
