"""Real-world LightningModules as trials on lightning_bridge.Trainer, against lightning.Trainer.

One case per part of what real projects use (tests/_zoo.py): `pytorch_lightning` classes,
Trainer settings the module reads and Trainer arguments it relies on, Lightning callbacks,
modules without validation and with several validation loaders, Lightning's order at an
epoch's end, and the metric names Lightning gives. Each trains to lightning.Trainer's
weights bit for bit; tests/interop/test_adapter_zoo.py runs every case on Determined too.
"""

from __future__ import annotations

import pathlib
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_bridge as bridge
from tests._zoo import CASES, Case, LitClassifier, blobs
from tests._zoo_runner import BRIDGE_TRAINER, Run, max_diff, run_lightning, run_trial

BY_NAME = {case.name: case for case in CASES}
PARTS = [
    "pytorch_lightning",  # the pytorch_lightning package
    "onecycle_epochs_in_batches",  # Trainer settings the module reads, length in batches
    "accumulate_clip",  # Trainer arguments: accumulation (not dividing the epoch), clipping
    "early_stopping",  # callbacks
    "swa",
    "accumulation_scheduler",
    "gan",  # no validation_step
    "noisy_no_validation",  # no validation_step, training draws from the global RNG
    "two_val_loaders",  # several validation loaders
    "epoch_end_order",  # validation before on_train_epoch_end
    "limit_batches",  # Trainer arguments as hparams: batch limits, logging, sanity check
    "val_check_interval_hparam",
    "limit_fractions",
]


@pytest.fixture
def workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _same_validations(lightning: Run, trial: Run) -> None:
    assert len(trial.validations) == len(lightning.validations)
    for theirs, ours in zip(lightning.validations, trial.validations, strict=True):
        wanted = {k: v for k, v in theirs.items() if k.startswith("val_")}
        assert {k: ours[k] for k in wanted} == pytest.approx(wanted, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("name", PARTS)
def test_trains_to_lightnings_weights(name: str, workdir: pathlib.Path) -> None:
    case = BY_NAME[name]
    lightning = run_lightning(case)
    trial = run_trial(bridge, case)
    assert max_diff(trial.weights, lightning.weights) == 0.0
    assert trial.global_step == lightning.global_step
    if lightning.validations:
        _same_validations(lightning, trial)
    else:
        # A module without validation reports its training epochs as validation metrics.
        assert len(trial.validations) == case.epochs
        keys = ("g_loss", "d_loss") if name == "gan" else (case.metric,)
        for epoch, metrics in enumerate(trial.validations):
            for key in keys:
                assert metrics[key] == pytest.approx(lightning.step_means[epoch][key], rel=1e-6)


def test_metric_names_are_lightnings(workdir: pathlib.Path) -> None:
    case = BY_NAME["onecycle"]
    lightning = run_lightning(case)
    trial = run_trial(bridge, case)
    final = {k: float(v) for k, v in lightning.module.trainer.callback_metrics.items()}
    # Logged on_step and on_epoch: reported under every name callback_metrics holds.
    assert {"val_loss", "val_loss_epoch", "val_acc"} <= set(trial.validations[-1])
    assert trial.validations[-1]["val_loss"] == pytest.approx(final["val_loss_epoch"])
    last = trial.training_reports[-1]
    assert {"train_loss", "train_loss_step", "train_loss_epoch"} <= set(last)
    # The epoch ended in the report: `train_loss` is the epoch value, as in callback_metrics.
    assert float(last["train_loss"]) == pytest.approx(final["train_loss_epoch"], rel=1e-6)
    assert float(last["train_loss_epoch"]) == pytest.approx(final["train_loss"], rel=1e-6)


def test_learning_rate_monitor_reports_learning_rates(workdir: pathlib.Path) -> None:
    trial = run_trial(bridge, BY_NAME["lr_monitor_user_callback"])
    # StepLR(step_size=1, gamma=0.8) by epoch from 0.1; LearningRateMonitor logs each step.
    lrs = [float(report["lr-SGD"]) for report in trial.training_reports]
    assert lrs == pytest.approx([0.1, 0.08, 0.064])


class ReadsTrainer(LitClassifier):
    """Records the Trainer settings a module reads when it configures its optimizers."""

    def configure_optimizers(self) -> Any:
        t = self.trainer
        self.read = {
            "max_epochs": t.max_epochs,
            "max_steps": t.max_steps,
            "estimated_stepping_batches": t.estimated_stepping_batches,
            "num_training_batches": t.num_training_batches,  # loaded by the estimate
            "world_size": t.world_size,
            "accumulate_grad_batches": t.accumulate_grad_batches,
            "gradient_clip_val": t.gradient_clip_val,
            "gradient_clip_algorithm": t.gradient_clip_algorithm,
            "precision": t.precision,
        }
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(blobs(8, 2), batch_size=8)


@pytest.mark.parametrize(
    ("length", "lightning_length", "extra"),
    [
        ({"epochs": 3}, {"max_epochs": 3}, {}),
        ({"batches": 15}, {"max_epochs": 3, "max_steps": 5}, {"accumulate_grad_batches": 3}),
        ({"epochs": 2}, {"max_epochs": 2}, {"gradient_clip_val": 0.5, "precision": "bf16-mixed"}),
    ],
)
def test_trainer_settings_answer_as_lightning(
    length: dict[str, int],
    lightning_length: dict[str, int],
    extra: dict[str, Any],
    workdir: pathlib.Path,
) -> None:
    expected = ReadsTrainer()
    lightning_args = {**lightning_length, **extra}
    pl.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, **lightning_args
    ).fit(expected)
    hparams = {"global_batch_size": 8, **extra}
    config = {"searcher": {"name": "single", "metric": "val_loss", "max_length": length}}
    with bridge.init(hparams=hparams, exp_conf=config, trainer_kwargs=BRIDGE_TRAINER) as ctx:
        trial = bridge.lightning_trial(ReadsTrainer)(ctx)
    read = trial.lightning_module.read
    assert read == expected.read
    assert trial.lightning_module.trainer.num_training_batches == 6


def test_pytorch_lightning_classes_are_accepted(workdir: pathlib.Path) -> None:
    import pytorch_lightning

    case: Case = BY_NAME["pytorch_lightning"]
    assert issubclass(case.module, pytorch_lightning.LightningModule)
    assert not issubclass(case.module, pl.LightningModule)
    trial_cls = bridge.lightning_trial(case.module, case.datamodule)
    assert issubclass(trial_cls, bridge.PyTorchTrial)


class SequentialAveraged(BY_NAME["swa"].module):  # type: ignore[misc, name-defined]
    """The SWA case without shuffling, so a continued run sees the same batches."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(48, 1), batch_size=8)


def test_continuing_keeps_the_callbacks_state(workdir: pathlib.Path) -> None:
    # SWA's averaged weights, its count and SWALR's state ride in the trial's checkpoint:
    # 2 epochs, then 2 more from the checkpoint, end where 4 epochs straight end.
    from tests._zoo_runner import weights

    case = BY_NAME["swa"]
    trial_cls = bridge.lightning_trial(SequentialAveraged, callbacks=case.callbacks())

    def fit(epochs: int, checkpoint: Any = None) -> Any:
        with bridge.init(
            hparams=dict(case.hparams),
            exp_conf={"searcher": {"name": "single", "metric": "val_loss",
                                   "max_length": {"epochs": 4}}},
            trainer_kwargs=BRIDGE_TRAINER,
            enable_tensorboard_logging=False,
        ) as ctx:  # fmt: skip
            trial = trial_cls(ctx)
            trainer = bridge.Trainer(trial, ctx)
            trainer.fit(
                max_length=bridge.Epoch(epochs),
                checkpoint_period=bridge.Epoch(1),
                latest_checkpoint=checkpoint,
            )
            return trial, trainer.checkpoints

    straight, _ = fit(4)
    _, checkpoints = fit(2)
    continued, _ = fit(4, checkpoints[-1])
    assert max_diff(weights(continued.lightning_module), weights(straight.lightning_module)) == 0
    swa = continued.lightning_module.trainer.callbacks[0]
    assert int(swa.n_averaged) == 3  # epochs 2, 3 and 4 were averaged


LENGTH = {"searcher": {"name": "single", "metric": "val_loss", "max_length": {"epochs": 1}}}


@pytest.mark.parametrize(
    ("hparams", "period", "message"),
    [
        (
            {"num_sanity_val_steps": 2},
            None,
            "['num_sanity_val_steps'] is 2: a trial runs no sanity",
        ),
        ({"limit_train_batches": 0}, None, "['limit_train_batches'] is 0, which makes"),
        ({"limit_val_batches": 1.5}, None, "['limit_val_batches'] is 1.5; give a fraction"),
        ({"limit_train_batches": 0.1}, None, "0.1 * 6 batches < 1: increase it"),
        ({"log_every_n_steps": 0}, None, "['log_every_n_steps'] must be an int >= 1"),
        # 0.7 of 6 batches is 4, counted within each epoch: not a period across epochs.
        ({"val_check_interval": 0.7}, {"batches": 4}, "which a trial's validation period"),
        ({"val_check_interval": 0.5}, {"epochs": 1}, "set min_validation_period: {batches: 3}"),
        ({"val_check_interval": 4, "check_val_every_n_epoch": None}, None, "which is not set"),
    ],
)
def test_trainer_arguments_a_trial_cannot_follow_are_refused_by_name(
    hparams: dict[str, Any], period: dict[str, int] | None, message: str, workdir: pathlib.Path
) -> None:
    config = {**LENGTH, **({"min_validation_period": period} if period else {})}
    with bridge.init(
        hparams={"global_batch_size": 8, **hparams}, exp_conf=config, trainer_kwargs=BRIDGE_TRAINER
    ) as ctx:
        with pytest.raises(bridge.InvalidTrialError) as raised:
            bridge.lightning_trial(LitClassifier)(ctx)
    assert message in str(raised.value)


class LogSwitch(pl.Callback):
    """Records whether callbacks log at each batch (what LearningRateMonitor asks)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.seen.append(bool(trainer._logger_connector.should_update_logs))


def test_log_every_n_steps_decides_when_callbacks_log_as_in_lightning(
    workdir: pathlib.Path,
) -> None:
    expected = LogSwitch()
    pl.Trainer(
        max_epochs=2,
        log_every_n_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[expected],
    ).fit(LitClassifier())
    hparams = {"global_batch_size": 8, "log_every_n_steps": 4}
    config = {"searcher": {**LENGTH["searcher"], "max_length": {"epochs": 2}}}
    with bridge.init(hparams=hparams, exp_conf=config, trainer_kwargs=BRIDGE_TRAINER) as ctx:
        trial = bridge.lightning_trial(LitClassifier, callbacks=[LogSwitch()])(ctx)
        bridge.Trainer(trial, ctx).fit(max_length=bridge.Epoch(2), checkpoint_policy="none")
    (ours,) = trial.lightning_module.trainer.callbacks
    assert ours.seen == expected.seen
    assert expected.seen.count(True) == 3  # steps 4, 8 and 12 of 12
    assert trial.lightning_module.trainer.log_every_n_steps == 4
