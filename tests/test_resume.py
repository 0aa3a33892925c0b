"""Pausing and continuing gives the same model as never stopping (bit for bit)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from tests._trials import RegressionData, quiet_init


class NoisyTrial(pytorch.PyTorchTrial):
    """Dropout, shuffled data, momentum and a per-batch LR schedule: every RNG and state path."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        torch.manual_seed(1)
        self.model = context.wrap_model(
            torch.nn.Sequential(
                torch.nn.Linear(4, 16),
                torch.nn.ReLU(),
                torch.nn.Dropout(0.3),
                torch.nn.Linear(16, 1),
            )
        )
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        )
        sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.7)
        context.wrap_lr_scheduler(sched, pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        self.stop_at = context.get_hparams().get("stop_at")

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(40), batch_size=8, shuffle=True)

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(16, seed=1), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if self.stop_at is not None and batch_idx + 1 == self.stop_at:
            self.context.set_stop_requested(True)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}


def _run(stop_at: int | None, checkpoint: str | None, agg: int, **fit_kwargs: Any) -> Any:
    hparams = {"global_batch_size": 8, "stop_at": stop_at}
    with quiet_init(hparams=hparams, aggregation_frequency=agg) as ctx:
        trial = NoisyTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(
            max_length=pytorch.Batch(17),
            reporting_period=pytorch.Batch(1),
            latest_checkpoint=checkpoint,
            **fit_kwargs,
        )
    return trial, trainer


@pytest.mark.parametrize(
    ("stop_at", "agg", "fit_kwargs"),
    [
        pytest.param(7, 1, {}, id="mid-epoch"),
        pytest.param(10, 1, {}, id="epoch-end"),
        pytest.param(13, 1, {}, id="mid-second-pass"),
        pytest.param(7, 2, {}, id="mid-gradient-accumulation"),
        pytest.param(6, 1, {"validation_period": pytorch.Batch(6)}, id="after-validation"),
    ],
)
def test_continue_equals_uninterrupted(stop_at: int, agg: int, fit_kwargs: dict) -> None:
    reference, _ = _run(None, None, agg, **fit_kwargs)
    paused, first = _run(stop_at, None, agg, **fit_kwargs)
    assert first.checkpoints, "the stop request wrote a checkpoint"
    assert not torch.equal(paused.model[0].weight, reference.model[0].weight), (
        "the paused run stopped early"
    )
    resumed, _ = _run(None, str(first.checkpoints[-1]), agg, **fit_kwargs)
    for a, b in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.opt.param_groups[0]["lr"] == reference.opt.param_groups[0]["lr"]
