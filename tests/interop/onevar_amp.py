"""Trials written as Determined's own AMP test fixtures are, against either API module.

Determined 0.38.1's `harness/tests/experiment/fixtures/pytorch_onevar_model.py` trains a
one-weight linear model without bias on `(x, x)` pairs whose `x` goes through stages (ones, a
large value, a tiny one, zero) so that a gradient scaler's scale moves; its AMP trials read
`context._aggregation_frequency` in `__init__` (line 338) to stretch each stage over one
optimizer step, and the automatic-AMP one replaces `context._scaler` after `use_amp()` and
reads it back. The trials here do the same through the same private attributes (written for
these tests, not copied), with the fixture's scaler class, `torch.cuda.amp.GradScaler`, so
that on a machine without a GPU the scalers are disabled, as the fixture's are there.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

STAGES = ["one"] * 5 + ["large"] + ["one"] * 4 + ["small"] + ["one"] * 4 + ["zero"] + ["one"] * 4
STAGE_VALUE = {"one": 1.0, "zero": 0.0, "small": 2e-14, "large": 2e4}
LR = 0.001
INIT_SCALE = 65536
GROWTH_INTERVAL = 4


class StageData(torch.utils.data.Dataset):
    """Each stage's `(x, x)` pair repeated for `repeat` records (one optimizer step's worth)."""

    def __init__(self, repeat: int) -> None:
        self.repeat = repeat

    def __len__(self) -> int:
        return len(STAGES) * self.repeat

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        value = STAGE_VALUE[STAGES[index // self.repeat]]
        return torch.tensor([value]), torch.tensor([value])


def _cuda_scaler() -> Any:
    with warnings.catch_warnings():
        # Deprecated in favour of torch.amp.GradScaler("cuda"), and disabled without CUDA.
        warnings.simplefilter("ignore")
        return torch.cuda.amp.GradScaler(init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)


def make_onevar_amp_trials(pytorch: Any) -> dict[str, type]:
    """The automatic-AMP and the manual-AMP trial, subclassing `pytorch.PyTorchTrial`."""

    class OneVarAMPBase(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            model = torch.nn.Linear(1, 1, bias=False)
            model.weight.data.fill_(0.0)
            self.model = context.wrap_model(model)
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), LR))
            # What the fixture reads: one optimizer step per stage.
            self.agg = self.context._aggregation_frequency
            self.rows: list[dict[str, Any]] = []

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(
                StageData(self.agg), batch_size=self.context.get_per_slot_batch_size()
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(StageData(1), batch_size=4)

        def _forward(self, data: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.model(data), label)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            data, label = batch
            w_before = self.model.weight.item()
            scale_before = float(self.scaler.get_scale())
            loss = self._train(data, label, batch_idx)
            row = {
                "stage": STAGES[batch_idx // self.agg],
                "scale_before": scale_before,
                "loss": loss.item(),
                "w_before": w_before,
                "w_after": self.model.weight.item(),
            }
            self.rows.append(row)
            return {"loss": loss}

        def _train(self, data: torch.Tensor, label: torch.Tensor, batch_idx: int) -> Any:
            raise NotImplementedError

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            data, label = batch
            return {"val_loss": self._forward(data, label)}

    class OneVarAutoAMP(OneVarAMPBase):
        """`use_amp()`, then the scaler replaced by one with a short growth interval."""

        def __init__(self, context: Any) -> None:
            context.experimental.use_amp()
            context._scaler = _cuda_scaler()
            super().__init__(context)
            self.scaler = self.context._scaler

        def _train(self, data: torch.Tensor, label: torch.Tensor, batch_idx: int) -> Any:
            loss = self._forward(data, label)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return loss

    class OneVarManualAMP(OneVarAMPBase):
        """The trial's own scaler (`wrap_scaler`) and autocast, updated once per step."""

        def __init__(self, context: Any) -> None:
            self.scaler = context.wrap_scaler(_cuda_scaler())
            super().__init__(context)

        def _train(self, data: torch.Tensor, label: torch.Tensor, batch_idx: int) -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # CUDA's autocast is disabled without CUDA
                with torch.autocast("cuda"):
                    loss = self._forward(data, label)
            self.context.backward(self.scaler.scale(loss))
            self.context.step_optimizer(self.opt, scaler=self.scaler)
            if (batch_idx + 1) % self.agg == 0:
                self.scaler.update()
            return loss

    return {"auto": OneVarAutoAMP, "manual": OneVarManualAMP}
