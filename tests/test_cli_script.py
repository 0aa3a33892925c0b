"""`lightning-bridge run` with script entrypoints: a Trainer-API train.py runs unchanged."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
from typing import Any

import pytest

from tests._folders import (
    BASE_CONFIG,
    SEED_7,
    cli_env,
    command,
    kept_checkpoints,
    steps_completed,
    validations,
    write_folder,
)


def _cli(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command("run", *args),
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


def _script_config(entrypoint: str, **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG)
    config["entrypoint"] = entrypoint
    config["hyperparameters"] = {"global_batch_size": 8, "lr": 0.05}
    config.update(changes)
    return config


@pytest.mark.processes
def test_script_learns_its_run_like_on_a_cluster(tmp_path: pathlib.Path) -> None:
    config = write_folder(tmp_path, _script_config("python3 train.py"))
    folder = config.parent
    first = _cli(tmp_path, str(config), "--test")
    assert first.returncode == 0, first.stdout + first.stderr
    seen = json.loads((folder / "script.0.json").read_text())
    assert seen["hparams"] == {"global_batch_size": 8, "lr": 0.05}
    assert seen["seed"] == SEED_7
    assert seen["user_data"] == {"url": "https://example.invalid/data"}
    assert seen["latest_checkpoint"] is None and seen["container_rank"] == 0
    # `from determined import pytorch` is the bridge; --test reached fit(): one batch.
    assert seen["pytorch_module"] == "determined.pytorch"
    assert seen["trainer_class"] == "lightning_bridge.translation.fit._trainer_api"
    assert seen["batches"] == 1
    assert "Last validation metrics" in first.stdout
    # One log format for the runner and the script's process (its engine line); no advertising.
    assert "lightning-bridge: INFO: Experiment 1, trial 1: python3 train.py" in first.stderr
    assert "lightning-bridge: INFO: GPU available" in first.stderr
    assert "Tip:" not in first.stdout + first.stderr
    assert f"{validations(folder)[-1]:.6f}" in first.stdout

    # --resume hands the checkpoint to the script as info.latest_checkpoint.
    second = _cli(tmp_path, str(config), "--resume", "latest")
    assert second.returncode == 0, second.stdout + second.stderr
    seen = json.loads((folder / "script.0.json").read_text())
    trial_dir = tmp_path / "xdg" / "lightning-bridge" / "experiments" / "1" / "trials" / "1"
    assert pathlib.Path(seen["latest_checkpoint"]).parent == trial_dir / "checkpoints"
    assert seen["batches"] == 6
    # The script's own process recorded its metrics and checkpoints as a trial class does.
    assert "Experiment 2" in second.stdout and "Trial 2: COMPLETED after 6 batches" in second.stdout
    assert [steps_completed(p) for p in kept_checkpoints(2)] == [6]


@pytest.mark.processes
def test_failing_script_exit_code(tmp_path: pathlib.Path) -> None:
    config = write_folder(
        tmp_path, _script_config("python3 train.py", hyperparameters={"fail": "script"})
    )
    result = _cli(tmp_path, str(config))
    assert result.returncode == 3
    assert "the entrypoint exited with code 3" in result.stderr
    assert "Last validation metrics" not in result.stdout


@pytest.mark.processes
def test_torch_distributed_launcher_runs_slots_per_trial_processes(
    tmp_path: pathlib.Path,
) -> None:
    entrypoint = "python3 -m determined.launch.torch_distributed -- python3 train.py"
    config = write_folder(tmp_path, _script_config(entrypoint, resources={"slots_per_trial": 2}))
    folder = config.parent
    result = _cli(tmp_path, str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [json.loads((folder / f"script.{r}.json").read_text()) for r in (0, 1)]
    assert [r["size"] for r in ranks] == [2, 2]
    assert ranks[0]["batches"] == 6
    assert len(validations(folder)) == 2
    assert result.stdout.count("Last validation metrics") == 1
    assert max(steps_completed(p) for p in kept_checkpoints()) == 6
