"""A TrialModule in a lightning.Trainer against determined==0.38.1.

* Determined checkpoints into a Trainer: `TrialModule(latest_checkpoint=...)` continues a
  checkpoint Determined wrote (at a stop request, and the 0.38.1 fixture) to the weights
  Determined's uninterrupted run (or the bridge's `fit`, for the fixture) ends with.
* Out of a Trainer: what `DeterminedCheckpoint` writes is loaded by Determined's
  `load_trial_from_checkpoint_path`, and Determined's own `Trainer.fit(latest_checkpoint=...)`
  continues it exactly as it continues its own checkpoint of the same batch.
* Parity at scale: the parity scenarios run as TrialModules on the Trainer schedule
  equivalent to their `fit(...)` (`trial_module_harness.TRAINER_SCHEDULES`): the same batches,
  final weights within 1e-6 and validation metrics within 1e-5 of Determined's.

No run validates before training ends unless both sides validate at the same batches: a
validation starts a data loader, which draws from torch's RNG, and the trial has dropout.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from types import ModuleType
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from .compare import diff_values, format_report
from .harness import isolated_environment, run_trial, seed_everything
from .trial_module_harness import TRAINER_SCHEDULES, run_trial_module
from .trials import SCENARIOS

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
bridge: ModuleType = pytest.importorskip("lightning_bridge")

from .ckpt_trials import (  # noqa: E402  (needs both APIs, checked above)
    BATCH_SIZE,
    CkptRecorder,
    model_weights,
    trial_class_for,
)

SEED = 4321
LR = 0.05
REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "determined_checkpoints" / "0.38.1"
QUIET = {
    "enable_checkpointing": False,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "accelerator": "cpu",
    "devices": 1,
}


def _exp_conf(shuffle: bool) -> dict[str, Any]:
    # 44 samples in batches of 8: 6 batches an epoch.
    return {"data": {"n_train": 44, "n_val": 14, "shuffle": shuffle}}


def reference_fit(
    *, shuffle: bool, max_batches: int, stop_after: int | None = None, latest: str | None = None
) -> tuple[dict[str, np.ndarray], float, list[pathlib.Path]]:
    """Determined's fit of the regression trial (validating only where training ends):
    final weights, learning rate, checkpoints written."""
    recorder = CkptRecorder()
    seed_everything(SEED)
    with reference.init(
        hparams={"global_batch_size": BATCH_SIZE, "lr": LR},
        exp_conf=_exp_conf(shuffle),
        enable_tensorboard_logging=False,
    ) as context:
        trial = trial_class_for(reference)(context, recorder=recorder, stop_after=stop_after)
        reference.Trainer(trial, context).fit(
            max_length=reference.Batch(max_batches),
            reporting_period=reference.Batch(1),
            checkpoint_policy="none",
            latest_checkpoint=latest,
        )
        return (
            model_weights(trial.model),
            float(trial.opt.param_groups[0]["lr"]),
            [pathlib.Path(d) for d in recorder.checkpoint_dirs],
        )


def module_fit(
    *,
    shuffle: bool,
    max_steps: int,
    latest: str | None = None,
    callbacks: list[Any] | None = None,
) -> tuple[dict[str, np.ndarray], float, Any]:
    """The same trial as a TrialModule in a lightning.Trainer that never validates."""
    seed_everything(SEED)
    with bridge.init(
        hparams={"global_batch_size": BATCH_SIZE, "lr": LR},
        exp_conf=_exp_conf(shuffle),
        enable_tensorboard_logging=False,
        accelerator="cpu",
        checkpoint_dir=pathlib.Path("bridge_checkpoints").resolve(),
    ) as context:
        trial = trial_class_for(bridge)(context, recorder=CkptRecorder())
        module = bridge.TrialModule(trial, context, latest_checkpoint=latest)
        pl.Trainer(max_steps=max_steps, limit_val_batches=0, callbacks=callbacks, **QUIET).fit(
            module
        )
        return model_weights(trial.model), float(trial.opt.param_groups[0]["lr"]), module


def assert_weights(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-6, err_msg=key)


# (data, stop point k, length n); see test_checkpoint_interop.REFERENCE_STOPS: a shuffled
# pass can only be continued from an epoch end of a Determined checkpoint.
REFERENCE_STOPS = {
    "sequential_mid_epoch": (False, 9, 16),
    "shuffled_epoch_end": (True, 12, 20),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_STOPS))
def test_trial_module_continues_a_determined_checkpoint(tmp_path: pathlib.Path, case: str) -> None:
    shuffle, k, n = REFERENCE_STOPS[case]
    with isolated_environment(tmp_path / "uninterrupted"):
        expected, expected_lr, _ = reference_fit(shuffle=shuffle, max_batches=n)
    with isolated_environment(tmp_path / "interrupted"):
        _, _, (checkpoint,) = reference_fit(shuffle=shuffle, max_batches=n, stop_after=k)
        got, lr, module = module_fit(shuffle=shuffle, max_steps=n, latest=str(checkpoint))
    assert module.state.batches_trained == n
    assert_weights(got, expected)
    assert lr == expected_lr


def test_trial_module_continues_the_determined_0_38_1_fixture_as_fit_does(
    tmp_path: pathlib.Path,
) -> None:
    """Determined 0.38.1's own checkpoint (TinyTrial after 4 batches) continued to batch 8 in
    a Trainer ends where the bridge's fit(latest_checkpoint=...) ends (which
    test_real_checkpoints_interop holds against Determined's)."""
    from lightning_bridge.contract import _import_map
    from lightning_bridge.contract._code_import import import_trial_class

    _import_map.install(force=True)  # the unchanged trial code imports `determined`
    try:
        trial_cls = import_trial_class("model_def:TinyTrial", FIXTURE / "code")
        results = []
        for how in ("fit", "module"):
            with isolated_environment(tmp_path / how):
                checkpoint = shutil.copytree(FIXTURE, pathlib.Path("source").resolve())
                with bridge.init(
                    exp_conf={"searcher": {"metric": "val_loss"}},
                    enable_tensorboard_logging=False,
                    accelerator="cpu",
                ) as context:
                    trial = trial_cls(context)
                    if how == "fit":
                        bridge.Trainer(trial, context).fit(
                            max_length=bridge.Batch(8),
                            checkpoint_policy="none",
                            latest_checkpoint=str(checkpoint),
                            warm_start=False,
                        )
                    else:
                        module = bridge.TrialModule(
                            trial, context, latest_checkpoint=str(checkpoint), warm_start=False
                        )
                        pl.Trainer(max_steps=8, limit_val_batches=0, **QUIET).fit(module)
                        assert module.state.batches_trained == 8
                    results.append(model_weights(trial.model))
    finally:
        _import_map.uninstall()
    fit_weights, module_weights = results
    for key, value in fit_weights.items():
        assert torch.equal(torch.from_numpy(module_weights[key]), torch.from_numpy(value)), key


def test_determined_continues_a_determined_checkpoint_callbacks_checkpoint(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeterminedCheckpoint's checkpoint after 9 batches of a TrialModule: Determined loads its
    weights, and its Trainer continues it to the weights it reaches from its own checkpoint
    of batch 9 (Determined's local mode restarts the data at batch 0 on every resume)."""
    k, n = 9, 15
    with isolated_environment(tmp_path / "determined"):
        _, _, (own,) = reference_fit(shuffle=False, max_batches=n, stop_after=k)
        with monkeypatch.context() as patch:
            # Determined 0.38.1 reads its own numpy RNG state only with full unpickling on
            # torch >= 2.6; the bridge's checkpoint below needs no such switch.
            patch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
            expected, expected_lr, _ = reference_fit(shuffle=False, max_batches=n, latest=own.name)
    with isolated_environment(tmp_path / "bridge"):
        storage = pathlib.Path(os.environ["XDG_DATA_HOME"]) / "determined"
        saver = bridge.DeterminedCheckpoint(storage, checkpoint_policy="none")
        at_k, _, _ = module_fit(shuffle=False, max_steps=k, callbacks=[saver])
        (written,) = saver.checkpoints
        assert written.parent == storage
        loaded = reference.load_trial_from_checkpoint_path(
            str(written), trial_class=trial_class_for(reference)
        )
        for key, value in model_weights(loaded.model).items():
            assert torch.equal(torch.from_numpy(value), torch.from_numpy(at_k[key])), key
        got, lr, _ = reference_fit(shuffle=False, max_batches=n, latest=written.name)
    assert_weights(got, expected)
    assert lr == expected_lr


# ----- parity at scale ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRAINER_SCHEDULES))
def test_trial_module_on_the_equivalent_trainer_schedule_matches_determined(
    tmp_path: pathlib.Path, name: str
) -> None:
    expected = run_trial(reference, SCENARIOS[name], tmp_path / "determined")
    got = run_trial_module(SCENARIOS[name], tmp_path / "module")
    assert got.train_indices == expected.train_indices
    lines = diff_values(expected.validation_metrics, got.validation_metrics, "validation")
    assert not lines, format_report(f"[{name}] validation metrics differ", lines)
    assert sorted(got.weights) == sorted(expected.weights)
    for model, state in expected.weights.items():
        for key, value in state.items():
            np.testing.assert_allclose(
                got.weights[model][key], value, rtol=1e-6, atol=1e-7, err_msg=f"{model}.{key}"
            )
    assert not diff_values(expected.final_lrs, got.final_lrs, "lr")


def test_the_0_38_1_fixtures_trial_on_the_equivalent_trainer_schedule_matches_determined(
    tmp_path: pathlib.Path,
) -> None:
    """TinyTrial (the code of the Determined 0.38.1 fixture: dropout, momentum, a per-batch LR
    schedule) trained from scratch on Determined with fit(max_length=Batch(8),
    validation_period=Batch(2)) and as a TrialModule with max_steps=8,
    val_check_interval=2, check_val_every_n_epoch=None: the same validations and weights."""
    import sys

    from lightning_bridge.contract import _import_map
    from lightning_bridge.contract._code_import import import_trial_class

    from .real_ckpt_cases import isolated, recording

    def trial_class(mapped: bool) -> type:
        sys.modules.pop("model_def", None)
        if mapped:
            _import_map.install(force=True)  # the trial's `determined` is the bridge
        return import_trial_class("model_def:TinyTrial", FIXTURE / "code")

    conf = {"searcher": {"metric": "val_loss"}}
    expected: dict[str, list[Any]] = {"train": [], "val": [], "batch_idx": []}
    with isolated(tmp_path / "determined"):
        with reference.init(exp_conf=conf, enable_tensorboard_logging=False) as context:
            trial = recording(reference, trial_class(False), expected)(context)
            reference.Trainer(trial, context).fit(
                max_length=reference.Batch(8),
                validation_period=reference.Batch(2),
                reporting_period=reference.Batch(2),
                checkpoint_policy="none",
            )
            expected_weights = model_weights(trial.model)
    got: dict[str, list[Any]] = {"train": [], "val": [], "batch_idx": []}
    try:
        cls = trial_class(True)
        with isolated(tmp_path / "module"):
            with bridge.init(exp_conf=conf, enable_tensorboard_logging=False) as context:
                trial = recording(bridge, cls, got)(context)
                schedule = {"max_steps": 8, "val_check_interval": 2, "log_every_n_steps": 2}
                pl.Trainer(check_val_every_n_epoch=None, **schedule, **QUIET).fit(
                    bridge.TrialModule(trial, context)
                )
                got_weights = model_weights(trial.model)
    finally:
        _import_map.uninstall()
        sys.modules.pop("model_def", None)
    assert got["batch_idx"] == expected["batch_idx"] == list(range(8))
    lines = diff_values(expected["val"], got["val"], "validation")
    assert len(got["val"]) == 4 and not lines, format_report("validations differ", lines)
    assert_weights(got_weights, expected_weights)
