"""LightningAdapter on lightning_bridge.Trainer: the same training as lightning.Trainer."""

from __future__ import annotations

from typing import Any

import pytest

import lightning_bridge as bridge
from tests._adapter_modules import (
    BRIDGE_INIT,
    DataModule,
    ManualNet,
    Net,
    PlateauNet,
    max_weight_diff,
    run_lightning,
    run_trial,
    weights,
)

HPARAMS = {"global_batch_size": 8, "lr": 0.1, "unused": 1}


@pytest.mark.parametrize("module_cls", [Net, PlateauNet, ManualNet])
def test_trains_like_lightning(module_cls: type) -> None:
    expected = module_cls(lr=0.1, batch_size=8)
    lightning_val = run_lightning(expected, epochs=2)
    trial, train, val = run_trial(
        bridge, bridge.lightning_trial(module_cls), HPARAMS, **BRIDGE_INIT
    )
    assert isinstance(trial.lightning_module, module_cls)
    assert max_weight_diff(weights(trial.lightning_module), weights(expected)) < 1e-6
    assert len(val) == 2
    for ours, theirs in zip(val, lightning_val, strict=True):
        for key in ("val_loss", "val_acc", "val_max", "val_count"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), key
    assert val[0]["val_count"] == 26.0
    # Learning rates end where Lightning's end.
    for opt_ours, opt_theirs in zip(trial.optimizers, expected.trainer.optimizers, strict=True):
        assert opt_ours.param_groups[0]["lr"] == pytest.approx(opt_theirs.param_groups[0]["lr"])


def test_training_metrics_are_the_logged_values() -> None:
    expected = Net(lr=0.1, batch_size=8)
    seen = run_lightning(expected, epochs=1)
    _, train, _ = run_trial(bridge, bridge.lightning_trial(Net), HPARAMS, epochs=1, **BRIDGE_INIT)
    assert len(train) == 1
    report = train[0]
    # on_epoch values are Lightning's epoch aggregates (computed at the epoch's end) ...
    lightning_epoch = float(expected.trainer.callback_metrics["train_loss_epoch"])
    assert report["train_loss_epoch"] == pytest.approx(lightning_epoch, rel=1e-6)
    assert report["train_acc"] == pytest.approx(
        float(expected.trainer.callback_metrics["train_acc"])
    )
    # ... step values and the training step's loss are averaged over the reporting window.
    assert report["train_loss_step"] == pytest.approx(report["loss"])
    assert report["batches"] == 8
    assert "val_loss" in seen[0]


def test_datamodule_built_from_hparams() -> None:
    expected = Net(lr=0.05, batch_size=4)
    dm = DataModule(batch_size=4)
    run_lightning(expected, epochs=1, datamodule=dm)
    trial_cls = bridge.lightning_trial(Net, DataModule)
    hparams = {"global_batch_size": 4, "lr": 0.05}
    trial, _, val = run_trial(bridge, trial_cls, hparams, epochs=1, **BRIDGE_INIT)
    assert isinstance(trial.datamodule, DataModule)
    # batch_size came from global_batch_size (one process), setup ran once for "fit".
    assert trial.datamodule.batch_size == 4
    assert trial.datamodule.setup_stages == ["fit"]
    assert max_weight_diff(weights(trial.lightning_module), weights(expected)) < 1e-6


def test_subclassing_lightning_adapter() -> None:
    class MyTrial(bridge.LightningAdapter):
        def __init__(self, context: Any) -> None:
            super().__init__(context, Net(lr=context.get_hparam("lr")))

    expected = Net(lr=0.1)
    run_lightning(expected, epochs=1)
    trial, _, _ = run_trial(bridge, MyTrial, HPARAMS, epochs=1, **BRIDGE_INIT)
    assert max_weight_diff(weights(trial.lightning_module), weights(expected)) < 1e-6
