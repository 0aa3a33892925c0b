"""Determined's mixed-precision calls on the bridge (CPU: the trial's own scaler path)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from lightning.fabric.plugins import Precision

import lightning_bridge as pytorch
from tests._amp_trial import make_scaler_trial
from tests._trials import LinearTrial, fit, quiet_init

ScalerTrial = make_scaler_trial(pytorch)


def test_wrap_scaler_skips_inf_steps_and_backs_off() -> None:
    trial, trainer = fit(ScalerTrial, max_length=pytorch.Batch(5))
    assert torch.equal(trial.weights[2], trial.weights[1])  # the inf step was skipped
    assert not torch.equal(trial.weights[3], trial.weights[2])
    assert trial.scales[:3] == [1024.0, 1024.0, 512.0]  # backed off once, at the inf batch
    state = torch.load(trainer.checkpoints[-1] / "state_dict.pth", weights_only=True)
    assert state["scaler_state_dict"]["scale"] == trial.scales[-1]


def test_scaler_state_is_restored_on_resume() -> None:
    _, first = fit(ScalerTrial, max_length=pytorch.Batch(3))
    trial, _ = fit(ScalerTrial, max_length=pytorch.Batch(4), latest_checkpoint="latest")
    assert trial.scales == [512.0]  # continued from the backed-off scale, not from 1024


def test_use_amp_without_a_gpu_does_nothing_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    class Amp(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            context.experimental.use_amp()
            super().__init__(context)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            self.forward_dtype = self.model(batch[0]).dtype
            return super().train_batch(batch, epoch_idx, batch_idx)

    with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
        trial, trainer = fit(Amp, max_length=pytorch.Batch(2))
    assert "no effect without a GPU" in caplog.text
    assert trial.forward_dtype == torch.float32
    # Lightning's full-precision plugin: no autocast, no gradient scaler.
    assert type(trainer.fabric.strategy.precision) is Precision


def test_configure_apex_amp_maps_to_native_amp(caplog: pytest.LogCaptureFixture) -> None:
    with quiet_init() as ctx:
        model = ctx.wrap_model(torch.nn.Linear(2, 2))
        opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
            out = ctx.configure_apex_amp(models=model, optimizers=opt, opt_level="O2")
    assert out == (model, opt)
    assert "apex is unmaintained" in caplog.text
    assert ctx.autocast_forward_pass(model) is model  # no GPU: unchanged, as in Determined


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("twice", "once, not both or twice"),
        ("after_model", "before wrap_model()"),
        ("not_a_scaler", "has no scale()"),
    ],
)
def test_wrap_scaler_misuse(setup: str, message: str) -> None:
    with quiet_init() as ctx:
        with pytest.raises(pytorch.InvalidTrialError) as info:
            if setup == "twice":
                ctx.wrap_scaler(torch.amp.GradScaler("cpu"))
                ctx.wrap_scaler(torch.amp.GradScaler("cpu"))
            elif setup == "after_model":
                ctx.wrap_model(torch.nn.Linear(2, 2))
                ctx.wrap_scaler(torch.amp.GradScaler("cpu"))
            else:
                scaler: Any = object()
                ctx.wrap_scaler(scaler)
    assert message in str(info.value)
