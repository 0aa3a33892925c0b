"""`lightning-bridge run` with trial-class entrypoints: an unchanged Determined folder trains."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml

import lightning_bridge as pytorch
from lightning_bridge.contract import _import_map
from lightning_bridge.experiment.cli._main import main
from lightning_bridge.experiment.config._config import parse_config
from lightning_bridge.translation.services._run_description import RecordConnection, RunDescription
from tests._folders import (  # isolated_imports: an autouse fixture
    BASE_CONFIG,
    SEED_7,
    checkpoint_weights,
    cli_env,
    command,
    isolated_imports,  # noqa: F401
    kept_checkpoints,
    steps_completed,
    validations,
    write_folder,
)


def _config(**changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG)
    config.update(changes)
    return config


def _checkpoints(folder: pathlib.Path) -> list[pathlib.Path]:
    """The checkpoints the newest experiment kept (the folder's run wrote none beside it)."""
    assert not (folder / "checkpoints").exists()
    return sorted(kept_checkpoints(), key=steps_completed)


def test_runs_an_unchanged_trial_folder(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_folder(tmp_path, _config(max_restarts=3, environment={"image": "x"}))
    folder = config.parent
    assert main(["run", str(config)]) == 0
    out, err = capsys.readouterr()

    # 64 records / 8 per batch = 8 batches an epoch, 2 epochs, validation every 4 batches.
    losses = validations(folder)
    assert len(losses) == 4
    assert losses == sorted(losses, reverse=True)  # it learns
    seen = json.loads((folder / "seen.json").read_text())
    assert seen == {
        "hparams": {"global_batch_size": 8, "lr": 0.05},
        "data": {"url": "https://example.invalid/data"},
        "seed": SEED_7,
        "size": 1,
        "metric": "validation_loss",
    }
    # The summary: last validation metric, the best checkpoint, the logs and TensorBoard.
    workspace = tmp_path / "xdg" / "lightning-bridge"
    assert "Experiment 1 (linear)" in out
    assert "Trial 1: COMPLETED after 16 batches (2 epochs)" in out
    assert "Last validation metrics" in out
    assert f"validation_loss  {losses[-1]:.6f}" in out
    kept = _checkpoints(folder)
    assert len(kept) == 1 and steps_completed(kept[-1]) == 16  # latest = best: one kept
    assert f"Best checkpoint: {kept[-1].name} (batch 16, validation_loss" in out
    assert f"Log directory: {workspace / 'experiments' / '1'}" in out
    assert f"TensorBoard: tensorboard --logdir {workspace / 'experiments' / '1'}\n" in out
    assert (workspace / "experiments" / "1" / "trials" / "1" / "tensorboard").is_dir()
    # Nothing is written beside the code: no log folder can shadow a package there.
    assert sorted(p.name for p in folder.iterdir()) == [
        "const.yaml", "events.jsonl", "init.0.json", "model_def.py", "seen.json", "train.py",
    ]  # fmt: skip
    # One warning lists the Determined keys the run does not use.
    assert err.count("not used by lightning-bridge") == 1
    assert "environment.image, max_restarts (a failed trial is not restarted" in err
    assert "Tip:" not in out + err
    # The run description the trial was trained from: complete, typed, versioned.
    trial_dir = workspace / "experiments" / "1" / "trials" / "1"
    run = RunDescription.read(trial_dir / "run.json")
    assert run.version == 1 and run.record == RecordConnection(str(workspace), 1, 1)
    assert (run.run_dir, run.checkpoint_dir) == (trial_dir, trial_dir / "checkpoints")
    assert run.context_dir == folder and run.entrypoint == "model_def:LinearTrial"
    assert run.hparams == {"global_batch_size": 8, "lr": 0.05} and run.trial_seed == SEED_7
    assert repr(run.max_length) == "Epoch(2)" and repr(run.validation_period) == "Batch(4)"
    assert run.engine.fabric_kwargs() == {
        "accelerator": "auto", "devices": 1, "num_nodes": 1, "strategy": "auto"
    }  # fmt: skip
    assert run.search is None and run.continue_command.startswith("lightning-bridge experiment")


def test_a_run_description_of_another_layout_is_refused(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**RunDescription().to_json(), "version": 99}))
    assert main(["_trial", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not a trial's run description (layout version 99" in err
    assert err.count("\n") == 1


def test_matches_the_same_trial_trained_directly(tmp_path: pathlib.Path) -> None:
    config = write_folder(tmp_path, name="cli")
    assert main(["run", str(config)]) == 0
    via_cli = checkpoint_weights(_checkpoints(config.parent)[-1])

    # The Trainer API by hand, with what the config says.
    direct = tmp_path / "direct"
    write_folder(tmp_path, name="direct")
    sys.path.insert(0, str(direct))
    _import_map.install(force=True)
    os.chdir(direct)
    import model_def  # type: ignore[import-not-found]

    with pytorch.init(
        hparams={"global_batch_size": 8, "lr": 0.05}, exp_conf=copy.deepcopy(BASE_CONFIG)
    ) as ctx:
        trial = model_def.LinearTrial(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Epoch(2), validation_period=pytorch.Batch(4)
        )
    assert validations(direct) == validations(config.parent)
    for key, value in via_cli.items():
        torch.testing.assert_close(value, trial.model.state_dict()[key], rtol=0, atol=0)


def test_set_overrides_lengths_and_hyperparameters(tmp_path: pathlib.Path) -> None:
    config = write_folder(tmp_path)
    code = main(
        [
            "run",
            str(config),
            "--set",
            "searcher.max_length={batches: 5}",
            "--set",
            "min_validation_period.batches=5",
            "--set",
            "hyperparameters.lr=0.01",
        ]
    )
    assert code == 0
    assert len(validations(config.parent)) == 1
    seen = json.loads((config.parent / "seen.json").read_text())
    assert seen["hparams"]["lr"] == 0.01
    assert steps_completed(_checkpoints(config.parent)[-1]) == 5


def test_records_lengths_use_the_global_batch_size(tmp_path: pathlib.Path) -> None:
    config = write_folder(
        tmp_path,
        _config(
            searcher={"name": "single", "metric": "validation_loss", "max_length": {"records": 56}},
            min_validation_period={"records": 24},
        ),
    )
    assert main(["run", str(config)]) == 0
    # 56 records / 8 = 7 batches; validation every 24 / 8 = 3 batches: after 3 and 6, and the
    # final validation the bridge runs at the end of training (as Determined does).
    assert len(validations(config.parent)) == 3
    assert steps_completed(_checkpoints(config.parent)[-1]) == 7


def test_test_mode_trains_one_batch(tmp_path: pathlib.Path) -> None:
    config = write_folder(tmp_path)
    assert main(["run", str(config), "--test"]) == 0
    assert len(validations(config.parent)) == 1
    assert steps_completed(_checkpoints(config.parent)[-1]) == 1


def test_resume_continues_to_the_same_weights(tmp_path: pathlib.Path) -> None:
    whole = write_folder(tmp_path, name="whole")
    assert main(["run", str(whole)]) == 0
    want = checkpoint_weights(_checkpoints(whole.parent)[-1])

    parts = write_folder(tmp_path, name="parts")
    assert main(["run", str(parts), "--set", "searcher.max_length.epochs=1"]) == 0
    assert main(["run", str(parts), "--resume", "latest"]) == 0
    last = _checkpoints(parts.parent)[-1]
    assert steps_completed(last) == 16
    for key, value in checkpoint_weights(last).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0)


def test_checkpoint_storage_and_policy(tmp_path: pathlib.Path) -> None:
    config = write_folder(
        tmp_path,
        _config(
            checkpoint_storage={
                "type": "shared_fs",
                "host_path": "store",
                "storage_path": "ckpts",
                "save_trial_latest": 1,
                "save_trial_best": 0,
            },
            checkpoint_policy="all",
        ),
    )
    assert main(["run", str(config)]) == 0
    store = config.parent / "store" / "ckpts"
    kept = [p for p in store.iterdir() if p.is_dir()]
    assert len(kept) == 1 and steps_completed(kept[0]) == 16
    assert kept == _checkpoints(config.parent)
    # Written in the trial's folder, then moved into the storage: nothing left behind.
    staging = tmp_path / "xdg" / "lightning-bridge" / "experiments" / "1" / "trials" / "1"
    assert not [p for p in (staging / "checkpoints").iterdir() if p.is_dir()]


def test_bad_config_exits_2_with_the_key_path(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_folder(
        tmp_path,
        _config(searcher={"name": "single", "metric": "m", "max_length": {"epochs": -3}}),
    )
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert "searcher.max_length.epochs: expected a positive integer, got -3" in err
    assert "Traceback" not in err
    assert not validations(config.parent)


def test_a_search_in_test_mode_trains_its_first_configuration(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hparams = {
        "global_batch_size": 8,
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1},
    }
    searcher = {"name": "random", "metric": "validation_loss", "max_trials": 4}
    config = write_folder(
        tmp_path,
        _config(hyperparameters=hparams, searcher={**BASE_CONFIG["searcher"], **searcher}),
    )
    # Test mode (Determined's runs one trial): the configuration the search draws first.
    assert main(["run", str(config), "--test"]) == 0
    seen = json.loads((config.parent / "seen.json").read_text())
    resolved = parse_config(yaml.safe_load(config.read_text()))
    assert seen["hparams"]["lr"] == resolved.first_configuration().hparams["lr"]
    # One trial: the single searcher samples the range once, from the experiment seed.
    assert main(["run", str(config), "--set", "searcher.name=single", "--test"]) == 0
    seen = json.loads((config.parent / "seen.json").read_text())
    expected = parse_config(yaml.safe_load(config.read_text()), ["searcher.name=single"])
    assert seen["hparams"]["lr"] == expected.hparams["lr"]
    assert 1e-3 <= seen["hparams"]["lr"] <= 1e-1
    # --storage is a search's; a config of one trial refuses it.
    capsys.readouterr()
    assert main(["run", str(config), "--set", "searcher.name=single", "--storage", "s"]) == 2
    assert "--storage keeps the state of a hyperparameter search" in capsys.readouterr().err


def test_trial_errors_exit_1(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_folder(tmp_path)
    # An exception of the trial's own code: its traceback, once.
    assert main(["run", str(config), "--set", "hyperparameters.fail=init"]) == 1
    err = capsys.readouterr().err
    assert err.count("RuntimeError: deliberate failure in __init__") == 1
    assert "Traceback" in err
    # A bridge error (bad input at run time): its message only.
    assert main(["run", str(config), "--resume", "latest"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of an earlier run" in err and "Traceback" not in err


def test_entrypoint_errors(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_folder(tmp_path, _config(entrypoint="model_def:NoSuchTrial"))
    assert main(["run", str(config)]) == 2
    assert "model_def has no 'NoSuchTrial'" in capsys.readouterr().err
    config = write_folder(tmp_path, _config(entrypoint="model_def:Data"), name="notatrial")
    assert main(["run", str(config)]) == 1
    assert "Data is not a PyTorchTrial subclass" in capsys.readouterr().err


def test_what_determined_refuses_runs_with_one_warning_saying_so(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    searcher = {"name": "single", "metric": "validation_loss", "max_time": 4}
    config = write_folder(tmp_path, _config(searcher={**searcher, "time_metric": "batches"}))
    assert main(["run", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "Trial 1: COMPLETED after 4 batches" in out
    said = (
        "Determined 0.38.1 would not run this config: searcher.max_time, searcher.time_metric: "
        "the single searcher of Determined has no such keys"
    )
    assert err.count(said) == 1


def test_two_processes_from_slots_per_trial(tmp_path: pathlib.Path) -> None:
    """slots_per_trial: 2 runs two DDP processes through Lightning's launcher, which re-runs
    the command for rank 1 (so this runs the real command line, `python -m lightning_bridge`)."""
    config = write_folder(tmp_path, _config(resources={"slots_per_trial": 2}))
    result = subprocess.run(
        command("run", "exp/const.yaml"),
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads((config.parent / "seen.json").read_text())
    assert seen["size"] == 2
    # The trial's __init__ runs once every process is started: rank, size, local and cross
    # rank and size as Determined gives them.
    for rank in (0, 1):
        got = json.loads((config.parent / f"init.{rank}.json").read_text())
        assert got == [rank, 2, rank, 2, 0, 1]
    # Each rank trains 4 records of the 8-record global batch: 8 batches an epoch as before,
    # so the same validations happen; the table is printed once.
    assert len(validations(config.parent)) == 4
    assert result.stdout.count("Last validation metrics") == 1
    assert steps_completed(_checkpoints(config.parent)[-1]) == 16


def test_launcher_trial_argument_runs_the_trial_class(tmp_path: pathlib.Path) -> None:
    entrypoint = "python3 -m determined.launch.torch_distributed --trial model_def:LinearTrial"
    config = write_folder(tmp_path, _config(entrypoint=entrypoint))
    assert main(["run", str(config), "--set", "searcher.max_length.epochs=1"]) == 0
    assert len(validations(config.parent)) == 2
