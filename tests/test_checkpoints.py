"""Checkpoints: safe loading, clear errors, the latest pointer, retention, Lightning's door."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from tests._trials import LinearTrial, fit, quiet_init


class _RunsCode:
    """Unpickling this calls os.system: the payload of a malicious checkpoint."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def checkpoint() -> pathlib.Path:
    # With an experiment config, load_data.json records the hparams (as Determined does).
    _, trainer = fit(max_length=pytorch.Batch(3), init_kwargs={"exp_conf": {}})
    return trainer.checkpoints[-1]


def _resume(ckpt: Any, trial_cls: type = LinearTrial, **init_kwargs: Any) -> Any:
    with pytest.raises(pytorch.InvalidCheckpointError) as info:
        fit(
            trial_cls,
            init_kwargs=init_kwargs,
            max_length=pytorch.Batch(6),
            latest_checkpoint=str(ckpt),
        )
    return info.value


def test_malicious_state_dict_is_refused_and_never_runs(
    checkpoint: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "pwned"
    state = torch.load(checkpoint / "state_dict.pth", weights_only=True)
    state["callbacks"] = {"evil": _RunsCode(marker)}
    torch.save(state, checkpoint / "state_dict.pth")
    err = _resume(checkpoint)
    assert "not loaded and nothing in it ran" in str(err) and "trust_checkpoint=True" in str(err)
    assert not marker.exists()
    with pytest.raises(pytorch.InvalidCheckpointError):
        pytorch.load_trial_from_checkpoint_path(checkpoint)
    assert not marker.exists()


def test_malicious_trial_state_is_refused(checkpoint: pathlib.Path, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "pwned"
    (checkpoint / "trial_state.pkl").write_bytes(pickle.dumps(_RunsCode(marker)))
    err = _resume(checkpoint)
    assert "trial_state.pkl refers to" in str(err)
    assert not marker.exists()


def test_trusted_opt_in_loads_custom_objects(checkpoint: pathlib.Path) -> None:
    state = torch.load(checkpoint / "state_dict.pth", weights_only=True)
    state["note"] = pathlib.PurePosixPath("kept")  # a harmless non-tensor object
    torch.save(state, checkpoint / "state_dict.pth")
    with pytest.raises(pytorch.InvalidCheckpointError):
        read_checkpoint(checkpoint)
    payload, trial_state = read_checkpoint(checkpoint, trusted=True)
    assert payload["note"] == pathlib.PurePosixPath("kept")
    assert trial_state is not None and trial_state.batches_trained == 3
    trial = pytorch.load_trial_from_checkpoint_path(
        checkpoint, torch_load_kwargs={"weights_only": False}
    )
    assert torch.equal(trial.model.weight, payload["models_state_dict"][0]["weight"])


def test_missing_directory(tmp_path: pathlib.Path) -> None:
    err = _resume(tmp_path / "nope")
    assert "does not exist" in str(err)


def test_not_a_checkpoint(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    err = _resume(tmp_path / "empty")
    assert "is not a checkpoint" in str(err) and "state_dict.pth" in str(err)


def test_truncated_state_dict(checkpoint: pathlib.Path) -> None:
    data = (checkpoint / "state_dict.pth").read_bytes()
    (checkpoint / "state_dict.pth").write_bytes(data[: len(data) // 2])
    err = _resume(checkpoint)
    assert "truncated or corrupt" in str(err)


class WiderTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.context.models[0] = self.model = torch.nn.Linear(5, 1)
        self.context.optimizers[0] = self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)


class TwoModelTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.other = context.wrap_model(torch.nn.Linear(4, 1))


def test_shape_mismatch_names_model_and_parameter(checkpoint: pathlib.Path) -> None:
    err = _resume(checkpoint, WiderTrial)
    assert "model 0" in str(err) and "weight" in str(err) and "size mismatch" in str(err)


def test_model_count_mismatch(checkpoint: pathlib.Path) -> None:
    err = _resume(checkpoint, TwoModelTrial)
    assert "holds 1 model(s) but the trial wraps 2" in str(err)


def test_optimizer_count_mismatch(checkpoint: pathlib.Path) -> None:
    state = torch.load(checkpoint / "state_dict.pth", weights_only=True)
    state["optimizers_state_dict"].append(state["optimizers_state_dict"][0])
    torch.save(state, checkpoint / "state_dict.pth")
    err = _resume(checkpoint)
    assert "holds 2 optimizer(s) but the trial wraps 1" in str(err)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lightning_bridge_format", 99, "newer than this version reads"),
        ("format", "saved_model", "format 'saved_model'"),
    ],
)
def test_unknown_format(checkpoint: pathlib.Path, field: str, value: Any, message: str) -> None:
    meta = json.loads((checkpoint / "metadata.json").read_text())
    meta[field] = value
    (checkpoint / "metadata.json").write_text(json.dumps(meta))
    err = _resume(checkpoint)
    assert message in str(err)


def test_latest_pointer_and_resume_from_latest() -> None:
    _, trainer = fit(max_length=pytorch.Batch(4), checkpoint_period=pytorch.Batch(2))
    ckpt_dir = trainer.checkpoints[-1].parent
    assert (ckpt_dir / "latest").read_text().strip() == trainer.checkpoints[-1].name
    trial, _ = fit(max_length=pytorch.Batch(6), latest_checkpoint="latest")
    assert trial.recorder.calls[0] == ("on_trial_startup", 4)


def test_latest_without_checkpoints_is_a_clear_error() -> None:
    with pytest.raises(pytorch.InvalidArgumentError) as info:
        fit(max_length=pytorch.Batch(2), latest_checkpoint="latest")
    assert "holds no checkpoint yet" in str(info.value)


def test_partial_saves_are_cleaned_up_and_never_loaded(checkpoint: pathlib.Path) -> None:
    partial = checkpoint.parent / ".0000-interrupted.partial"
    partial.mkdir()
    (partial / "state_dict.pth").write_bytes(b"half a file")
    fit(max_length=pytorch.Batch(5), latest_checkpoint=str(checkpoint))
    assert not partial.exists()


def test_retention_keeps_latest_and_best(tmp_path: pathlib.Path) -> None:
    scores = iter([5.0, 1.0, 3.0, 4.0])

    class Scored(LinearTrial):
        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            return {"score": self.score}

    class Feed(pytorch.PyTorchCallback):
        def __init__(self, trial: Scored) -> None:
            self.trial = trial

        def on_validation_start(self) -> None:
            self.trial.score = next(scores)

    class Trial(Scored):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            return {"feed": Feed(self)}

    conf = {
        "searcher": {"metric": "score", "smaller_is_better": True},
        "checkpoint_storage": {
            "type": "shared_fs",
            "host_path": str(tmp_path / "store"),
            "save_trial_latest": 1,
            "save_trial_best": 1,
        },
    }
    _, trainer = fit(
        Trial,
        init_kwargs={"exp_conf": conf},
        max_length=pytorch.Batch(8),
        validation_period=pytorch.Batch(2),
        checkpoint_policy="all",
    )
    on_disk = sorted(p for p in (tmp_path / "store").iterdir() if p.is_dir())
    steps = sorted(
        json.loads((p / "metadata.json").read_text())["steps_completed"] for p in on_disk
    )
    assert steps == [4, 8]  # the best (score 1.0 at batch 4) and the latest
    assert sorted(trainer.checkpoints) == on_disk


def test_lightning_checkpoints_carry_the_trial_state(tmp_path: pathlib.Path) -> None:
    def run(epochs: int, ckpt_path: str | None) -> Any:
        with quiet_init() as ctx:
            trial = LinearTrial(ctx)
            module = pytorch.TrialModule(trial, ctx)
            saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "pl", save_last=True)
            pl.Trainer(
                max_epochs=epochs,
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                callbacks=[saver],
            ).fit(module, ckpt_path=ckpt_path)
        return trial, module

    straight, _ = run(2, None)
    shutil.rmtree(tmp_path / "pl")
    run(1, None)
    resumed, module = run(2, str(tmp_path / "pl" / "last.ckpt"))
    assert module.state.batches_trained == 8 and module.state.epochs_trained == 2
    assert resumed.recorder.calls[0] == ("on_trial_startup", 4)
    assert torch.equal(resumed.model.weight, straight.model.weight)
