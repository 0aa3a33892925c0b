"""A trial using Determined's wrap_scaler API, written against either API module."""

from __future__ import annotations

from typing import Any

import torch

from tests._trials import RegressionData


def make_scaler_trial(pytorch: Any) -> type:
    class ScalerTrial(pytorch.PyTorchTrial):
        """Scales its own loss; batch 2's gradients are inf so that step must be skipped."""

        def __init__(self, context: Any) -> None:
            self.context = context
            self.scaler = context.wrap_scaler(torch.amp.GradScaler("cpu", init_scale=1024.0))
            torch.manual_seed(0)
            self.model = context.wrap_model(torch.nn.Linear(4, 1))
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
            )
            self.weights: list[torch.Tensor] = []
            self.scales: list[float] = []

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(RegressionData(32), batch_size=8)

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(RegressionData(16, seed=1), batch_size=8)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            if batch_idx == 2:
                loss = loss * float("inf")
            self.context.backward(self.scaler.scale(loss))
            self.context.step_optimizer(
                self.opt,
                clip_grads=lambda params: torch.nn.utils.clip_grad_norm_(params, 1e6),
                scaler=self.scaler,
            )
            self.scaler.update()
            self.weights.append(self.model.weight.detach().clone())
            self.scales.append(float(self.scaler.get_scale()))
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}

    return ScalerTrial
