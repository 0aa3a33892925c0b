"""Determined's Core API under `lightning-bridge run`: a `det.core.init()` script is recorded
(metrics, checkpoints in storage with retention, TensorBoard), paused and continued from its
latest checkpoint, searched (ASHA stops trials through `should_preempt()`), ended by InvalidHP,
and run on two processes with sharded checkpoints, as on a Determined cluster."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_bridge.record._registry import Registry
from tests._core_api_runs import core_folder, described, lb, seen_runs
from tests._folders import (
    Gate,
    finish,
    start_run,
    wait_for,
    workspace,
)

pytestmark = pytest.mark.processes


def run_dir(folder: pathlib.Path, trial: int = 1, experiment: int = 1) -> pathlib.Path:
    return workspace(folder) / "experiments" / str(experiment) / "trials" / str(trial)


def checkpoint_state(folder: pathlib.Path, trial: int = 1) -> dict[str, Any]:
    with Registry(workspace(folder)) as registry:
        latest = registry.latest_checkpoint(trial)
        assert latest is not None
        state: dict[str, Any] = torch.load(pathlib.Path(latest.location) / "state.pt")
        return state


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The folder of the script's default run (one trial of 12 batches, a report and a
    checkpoint every 4), run once per module: one test checks what it recorded, others compare
    their runs with it; none writes to it."""
    folder = core_folder(tmp_path_factory.mktemp("plain"))
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_a_script_is_recorded_with_its_checkpoints_and_tensorboard(plain: pathlib.Path) -> None:
    folder = plain
    data = described(folder)
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED"
    assert [m["batches"] for m in trial["training"]] == [4, 8, 12]
    assert [sorted(m["values"]) for m in trial["training"]] == [["loss"]] * 3
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    # Recorded as reported: no batch / epoch counters added to a script's own metrics.
    assert [sorted(m["values"]) for m in trial["validation"]] == [["val_loss"]] * 3
    assert [m["values"] for m in trial["groups"]["extra"]] == [{"seen": n} for n in (4, 8, 12)]
    (seen,) = seen_runs(run_dir(folder))
    assert seen["latest"] is None and seen["trained"] == list(range(1, 13))
    assert seen["best"] is None  # nothing validated yet in the experiment
    # report_progress, set_status and set_metadata: the script's last word, in the record.
    assert (trial["progress"], trial["status"]) == (1.0, "trained 12 of 12")
    assert seen["metadata"] is None and trial["metadata"] == {"done": 12, "starts": 1}
    shown = lb(folder, "experiment", "describe", "1").stdout
    assert "trial 1: progress 100%" in shown and "trial 1: status: trained 12 of 12" in shown
    # Retention (Determined's defaults: the latest and the best) kept the last checkpoint,
    # in the config's storage, with the script's files and metadata.
    kept = data["checkpoints"]
    assert [c["batches"] for c in kept] == [12]
    where = pathlib.Path(kept[0]["location"])
    assert sorted(p.name for p in where.iterdir()) == ["metadata.json", "shard.0", "state.pt"]
    assert json.loads((where / "metadata.json").read_text()) == {
        "steps_completed": 12,
        "rank_0": 0,
    }
    assert checkpoint_state(folder)["steps"] == 12
    listed = lb(folder, "checkpoint", "list", "--experiment", "1")
    assert listed.returncode == 0 and kept[0]["uuid"] in listed.stdout, listed.stdout
    # TensorboardMode.AUTO: the reported metrics are in the trial's TensorBoard folder, under
    # Determined's tags at the steps reported, written without importing Lightning.
    (events,) = (run_dir(folder) / "tensorboard").rglob("events.out.tfevents*")
    scalars = EventAccumulator(str(events))
    scalars.Reload()
    assert {"Determined/loss", "Determined/val_loss"} <= set(scalars.Tags()["scalars"])
    for tag, reported in (("loss", trial["training"]), ("val_loss", trial["validation"])):
        written = scalars.Scalars(f"Determined/{tag}")
        assert [e.step for e in written] == [m["batches"] for m in reported]
        assert [e.value for e in written] == pytest.approx([m["values"][tag] for m in reported])
    assert seen["lightning"] is False


def test_paused_and_continued_it_ends_as_the_uninterrupted_run(
    tmp_path: pathlib.Path, plain: pathlib.Path
) -> None:
    (uninterrupted,) = seen_runs(run_dir(plain))

    gate = Gate.at(tmp_path / "gate")  # held before its 6th batch
    folder = core_folder(tmp_path, "paused", hyperparameters=gate.hparams(5))
    run = start_run(folder)
    wait_for(gate.reached, run)
    paused = lb(folder, "experiment", "pause", "1")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    code, out, err, _ = finish(run, 180)
    assert code == 0, out + err
    first = described(folder)["trials"][0]
    assert first["state"] == "STOPPED", first
    (stopped,) = seen_runs(run_dir(folder))
    # The signal came at batch 5; the script checkpointed at its next boundary and stopped.
    assert stopped["preempted_at"] == 8 and stopped["trained"] == list(range(1, 9))

    gate.release()
    continued = lb(folder, "experiment", "continue", "1")
    assert continued.returncode == 0, continued.stdout + continued.stderr
    trial = described(folder)["trials"][0]
    assert trial["state"] == "COMPLETED", trial
    _, resumed = seen_runs(run_dir(folder))
    # It continued from its checkpoint at batch 8 (never trained from scratch twice)...
    assert resumed["latest"] is not None and resumed["trained"] == [9, 10, 11, 12]
    assert resumed["restored_files"] == ["metadata.json", "shard.0", "state.pt"]
    # ...and ends with the uninterrupted run's weights and reports.
    assert resumed["weights"] == uninterrupted["weights"]
    # The run metadata outlives the pause: the second run read what the first set.
    assert resumed["metadata"] == {"done": 8, "starts": 1}
    assert trial["metadata"] == {"done": 12, "starts": 2} and trial["progress"] == 1.0
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    plain_trial = described(plain)["trials"][0]
    assert [m["values"] for m in trial["validation"]] == [
        m["values"] for m in plain_trial["validation"]
    ]


def test_invalid_hp_ends_the_trial_completed_with_its_message(tmp_path: pathlib.Path) -> None:
    folder = core_folder(tmp_path, hyperparameters={"invalid": True})
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = described(folder)["trials"]
    assert trial["state"] == "COMPLETED"
    assert trial["message"] == "InvalidHP: invalid=true cannot train"
    assert trial["validation"] == []


def test_an_adaptive_asha_search_stops_trials_through_should_preempt(
    tmp_path: pathlib.Path,
) -> None:
    """ASHA ranks each trial at its rungs on the validation metrics the script reports; a trial
    it stops sees should_preempt() after its checkpoint there and exits, COMPLETED."""
    folder = core_folder(
        tmp_path,
        hyperparameters={
            "lr": {"type": "categorical", "vals": [0.001, 0.01, 0.05, 0.08]},
            "steps": 16,
        },
        searcher={
            "name": "adaptive_asha",
            "metric": "val_loss",
            "time_metric": "batches",
            "max_time": 16,
            "max_trials": 4,
            "max_concurrent_trials": 1,
            "mode": "aggressive",
            "max_rungs": 2,
            "divisor": 4,
        },
        # Draws 0.08 first, then only smaller rates (worse at the rung): with one trial at a
        # time, asynchronous ASHA promotes the first and stops the others, whatever the order
        # of their reports. A random seed could draw rates better one after another, and ASHA
        # would rightly promote every trial.
        reproducibility={"experiment_seed": 3},
    )
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    data = described(folder)
    trials = data["trials"]
    assert len(trials) == 4 and {t["state"] for t in trials} == {"COMPLETED"}, trials
    stopped = {}
    for t in trials:
        (seen,) = seen_runs(run_dir(folder, t["id"]))
        stopped[t["id"]] = seen["preempted_at"]
        # Each report reached the search's record; a stopped trial stopped at a rung (4).
        assert [m["batches"] for m in t["validation"]] == list(
            range(4, (seen["trained"][-1] + 1), 4)
        )
    # Promoted and trained to max_time (where the searcher's stop meets the end of training),
    # or stopped at the first rung (4 batches): the first trial's rate is the best.
    assert stopped == {1: 16, 2: 4, 3: 4, 4: 4}, stopped


def test_two_processes_store_sharded_checkpoints_and_train_as_one(
    tmp_path: pathlib.Path, plain: pathlib.Path
) -> None:
    (one,) = seen_runs(run_dir(plain))
    folder = core_folder(
        tmp_path,
        "two",
        entrypoint="python3 -m determined.launch.torch_distributed python3 train.py",
        resources={"slots_per_trial": 2},
    )
    done = lb(folder, "run", "const.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = described(folder)["trials"]
    assert trial["state"] == "COMPLETED"
    assert [m["batches"] for m in trial["validation"]] == [4, 8, 12]
    (rank0,) = seen_runs(run_dir(folder), 0)
    (rank1,) = seen_runs(run_dir(folder), 1)
    assert rank0["weights"] == rank1["weights"]
    assert rank0["weights"] == pytest.approx(one["weights"], abs=1e-6)
    (kept,) = described(folder)["checkpoints"]
    where = pathlib.Path(kept["location"])
    # Every process's shard, and the metadata of both merged.
    assert sorted(p.name for p in where.iterdir()) == [
        "metadata.json",
        "shard.0",
        "shard.1",
        "state.pt",
    ]
    assert json.loads((where / "metadata.json").read_text()) == {
        "steps_completed": 12,
        "rank_0": 0,
        "rank_1": 1,
    }


def test_checkpoints_in_s3_continue_a_paused_script_from_the_bucket(tmp_path: pathlib.Path) -> None:
    """`checkpoint_storage: s3` (moto's server): `store_path` lands in the bucket, retention
    applies there, and a paused script continues from its checkpoint fetched back from it."""
    from tests._servers import moto_server, s3_filesystem, s3_storage_section

    with moto_server() as endpoint:
        fs = s3_filesystem(endpoint)
        fs.mkdir("core")
        storage = s3_storage_section(endpoint, "core", "runs", save_trial_latest=1)
        gate = Gate.at(tmp_path / "gate")  # held before its 6th batch
        folder = core_folder(tmp_path, hyperparameters=gate.hparams(5), checkpoint_storage=storage)
        run = start_run(folder)
        wait_for(gate.reached, run)
        assert lb(folder, "experiment", "pause", "1").returncode == 0
        code, out, err, _ = finish(run, 180)
        assert code == 0, out + err
        gate.release()
        continued = lb(folder, "experiment", "continue", "1")
        assert continued.returncode == 0, continued.stdout + continued.stderr
        data = described(folder)
        _, resumed = seen_runs(run_dir(folder))
        assert resumed["trained"] == [9, 10, 11, 12]
        assert resumed["restored_files"] == ["metadata.json", "shard.0", "state.pt"]
        (kept,) = data["checkpoints"]  # save_trial_latest=1, the best being the latest
        assert kept["batches"] == 12 and kept["location"].startswith("s3://core/runs/")
        in_bucket = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("core/runs", refresh=True))
        assert in_bucket == [kept["uuid"]], in_bucket
        files = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"core/runs/{kept['uuid']}"))
        assert files == ["metadata.json", "shard.0", "state.pt"]


MANUAL_TENSORBOARD = """
import json, sys
import determined as det
from determined import core
from torch.utils.tensorboard import SummaryWriter

mode = det.get_cluster_info().trial.hparams["mode"]
with det.core.init(tensorboard_mode=core.TensorboardMode[mode]) as core_context:
    core_context.train.report_training_metrics(steps_completed=1, metrics={"loss": 0.5})
    writer = SummaryWriter(str(core_context.train.get_tensorboard_path()))
    writer.add_scalar("mine", 1.0, 1)
    writer.close()
    try:
        core_context.train.upload_tensorboard_files()
        said = None
    except RuntimeError as exc:
        said = str(exc)
with open(f"upload.{mode}.json", "w") as f:
    json.dump(said, f)
"""


def test_tensorboard_mode_manual_leaves_tensorboard_to_the_script(tmp_path: pathlib.Path) -> None:
    """MANUAL: the bridge writes no events of its own; the script's, in
    `get_tensorboard_path()`, are kept and `upload_tensorboard_files()` accepts them. AUTO:
    the reported metrics are written, and the upload is refused, as on Determined."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = core_folder(tmp_path, entrypoint="python3 tb.py")
    (folder / "tb.py").write_text(MANUAL_TENSORBOARD)
    tags = {}
    for experiment, mode in ((1, "MANUAL"), (2, "AUTO")):
        done = lb(folder, "run", "const.yaml", "--set", f"hyperparameters.mode={mode}")
        assert done.returncode == 0, done.stdout + done.stderr
        assert described(folder, experiment)["trials"][0]["training"][0]["values"] == {"loss": 0.5}
        scalars: set[str] = set()
        trial_dir = run_dir(folder, trial=experiment, experiment=experiment)  # one trial each
        for events in (trial_dir / "tensorboard").rglob("events*"):
            scalars |= set(EventAccumulator(str(events)).Reload().Tags()["scalars"])
        tags[mode] = scalars
    assert tags["MANUAL"] == {"mine"}, tags
    assert "mine" in tags["AUTO"] and any("loss" in t for t in tags["AUTO"]), tags
    said = {m: json.loads((folder / f"upload.{m}.json").read_text()) for m in tags}
    assert said == {
        "MANUAL": None,
        "AUTO": "upload_tensorboard_files can only be used in MANUAL mode",
    }
