"""Hugging Face's Trainer on DeepSpeed (`--deepspeed ds_config.json`, ZeRO 2) with `DetCallback`
under `lightning-bridge run`, two processes behind Determined's deepspeed launcher, on the CPU
(`DS_ACCELERATOR=cpu`, gloo): the script finds its DeepSpeed config with
`get_ds_config_path_from_args` and the Trainer trains on DeepSpeed's engine at that stage;
every process's shard of the checkpoint reaches storage; a paused trial continues from the
uploaded checkpoint at the step it saved. `HF_TRAIN` (tests/_hf_runs.py) is the script.

Marked `transformers`: the transformers session installs DeepSpeed for it."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
from typing import Any

import pytest

from tests import _core_api_runs
from tests._core_api_runs import seen_runs
from tests._folders import Gate, finish, start_run, wait_for, workspace
from tests._hf_runs import hf_folder

pytestmark = [
    pytest.mark.transformers,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="needs DeepSpeed: pip install 'lightning-bridge[deepspeed]' (the transformers "
        "session installs it)",
    ),
]

# ZeRO 2 with the Trainer's values ("auto"): its optimizer and batch sizes.
DS_CONFIG = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
}


def ds_folder(tmp_path: pathlib.Path, name: str, **config: Any) -> pathlib.Path:
    folder = hf_folder(
        tmp_path,
        name,
        launcher="python3 -m determined.launch.deepspeed",
        args=["--per_device_train_batch_size", "4", "--deepspeed", "ds_config.json"],
        resources={"slots_per_trial": 2},
        environment={"environment_variables": ["DS_ACCELERATOR=cpu"]},
        **config,
    )
    (folder / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    return folder


def lb(folder: pathlib.Path, *args: str) -> Any:
    return _core_api_runs.lb(folder, *args, timeout=900)


def described(folder: pathlib.Path) -> dict[str, Any]:
    return _core_api_runs.described(folder, 1, timeout=600)


def run_dir(folder: pathlib.Path) -> pathlib.Path:
    return workspace(folder) / "experiments" / "1" / "trials" / "1"


def test_zero_2_trains_checkpoints_pauses_and_continues(tmp_path: pathlib.Path) -> None:
    gate = Gate.at(tmp_path / "gate")  # held before step 6 (5 trained)
    out = tmp_path / "paused-out"
    folder = ds_folder(tmp_path, "paused", output_dir=out, hyperparameters=gate.hparams(5))
    run = start_run(folder)
    wait_for(lambda: gate.reached() >= 2, run, timeout=600, what="both processes held")
    paused = lb(folder, "experiment", "pause", "1")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    # The chief took the pause (the trial's stop is agreed at its next log); the other process
    # must leave the gate too, to meet it there.
    gate.release()
    code, stdout, stderr, _ = finish(run, 600)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    trial = described(folder)["trials"][0]
    assert trial["state"] == "STOPPED", trial
    first = seen_runs(run_dir(folder), 1)
    # Both processes trained on DeepSpeed's engine at the config's stage, and stopped at the
    # Trainer's next log after the pause (step 8), saving there.
    for seen in (first, seen_runs(run_dir(folder), 0)):
        (stopped,) = seen
        assert stopped["config_stage"] == 2 and stopped["engine_stage"] == 2, stopped
        assert stopped["engine"] == "DeepSpeedEngine" and stopped["global_step"] == 8, stopped
    (kept,) = described(folder)["checkpoints"]
    assert kept["batches"] == 8
    # Every process uploaded its shard of the ZeRO state into the one checkpoint.
    where = pathlib.Path(kept["location"]) / "checkpoint-8"
    shards = sorted(p.name for p in where.rglob("*optim_states.pt"))
    assert len(shards) == 2 and any("rank_0" in n for n in shards), shards
    assert any("rank_1" in n for n in shards), shards

    # Continued elsewhere (nothing of the Trainer's folder left): DetCallback downloads the
    # checkpoint on both processes and the Trainer resumes from its step.
    shutil.rmtree(out)
    continued = lb(folder, "experiment", "continue", "1")
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-3000:]
    trial = described(folder)["trials"][0]
    assert trial["state"] == "COMPLETED", trial
    for rank in (0, 1):
        _, resumed = seen_runs(run_dir(folder), rank)
        assert resumed["resumed_from"] == "checkpoint-8", resumed
        assert resumed["global_step"] == 12 and resumed["engine_stage"] == 2, resumed
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    assert [c["batches"] for c in described(folder)["checkpoints"]] == [12]
