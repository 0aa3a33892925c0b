"""A trial written with `determined.pytorch`'s classes trains on `lightning_bridge.Trainer`.

Where Determined is installed, unchanged trial code (`from determined import pytorch`) builds
its trial on Determined's classes and enums: `PyTorchTrial`, `DataLoader`, `Reducer`,
`MetricReducer`, `PyTorchCallback`, `LRScheduler.StepMode` (every mode, ReduceLROnPlateau
wrapped with `MANUAL_STEP`), and `Batch` / `Epoch` for `fit()`. The bridge's Trainer must take
each of them where it takes its own, and train such a trial exactly as Determined does.
"""

from __future__ import annotations

import pathlib
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from .harness import run_trial
from .trials import SCENARIOS

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
bridge: ModuleType = pytest.importorskip("lightning_bridge")

# Every StepMode, Reducer member, MetricReducer, DataLoader and fit() unit of Determined.
MIXED = ["sgd_dropout", "two_models", "reducers", "aggregation3"]


@pytest.mark.parametrize("name", MIXED)
def test_determined_classes_on_the_bridge_train_as_on_determined(
    name: str, tmp_path: pathlib.Path
) -> None:
    expected = run_trial(reference, SCENARIOS[name], tmp_path / "determined")
    got = run_trial(bridge, SCENARIOS[name], tmp_path / "mixed", trial_api=reference)
    assert got.train_indices == expected.train_indices
    for model, weights in expected.weights.items():
        for key, value in weights.items():
            np.testing.assert_allclose(got.weights[model][key], value, rtol=1e-6, atol=1e-7)
    assert got.final_lrs.keys() == expected.final_lrs.keys()
    for name, lrs in expected.final_lrs.items():
        assert got.final_lrs[name] == pytest.approx(lrs)
    assert len(got.validation_metrics) == len(expected.validation_metrics)
    for ours, theirs in zip(got.validation_metrics, expected.validation_metrics, strict=True):
        for key, value in theirs.items():
            np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(value), rtol=1e-5)


def _plateau_trial(api: ModuleType) -> type:
    class PlateauTrial(api.PyTorchTrial):  # type: ignore[misc, name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            gen = torch.Generator().manual_seed(0)
            self.model = context.wrap_model(torch.nn.Linear(3, 1))
            with torch.no_grad():
                for p in self.model.parameters():
                    p.copy_(torch.randn(p.shape, generator=gen))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
            self.plateau = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.ReduceLROnPlateau(
                    self.opt, factor=0.5, patience=0, threshold=0.5
                ),
                step_mode=api.LRScheduler.StepMode.MANUAL_STEP,
            )
            g = torch.Generator().manual_seed(1)
            self.x = torch.randn(24, 3, generator=g)
            self.y = self.x.sum(1, keepdim=True) + 0.5 * torch.randn(24, 1, generator=g)

        def _loader(self) -> Any:
            data = torch.utils.data.TensorDataset(self.x, self.y)
            return api.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

        def build_training_data_loader(self) -> Any:
            return self._loader()

        def build_validation_data_loader(self) -> Any:
            return self._loader()

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}

        def build_callbacks(self) -> dict[str, Any]:
            plateau = self.plateau

            class Step(api.PyTorchCallback):  # type: ignore[misc, name-defined]
                def on_validation_end(self, metrics: dict[str, Any]) -> None:
                    plateau.step(float(metrics["val_loss"]))

            return {"plateau": Step()}

    return PlateauTrial


def test_reduce_lr_on_plateau_wrapped_with_determineds_step_mode(
    reference_workdir: pathlib.Path,
) -> None:
    lrs = {}
    for name, trainer_api in (("determined", reference), ("bridge", bridge)):
        extra = {"trainer_kwargs": {"enable_progress_bar": False}} if trainer_api is bridge else {}
        with trainer_api.init(hparams={"global_batch_size": 8}, **extra) as ctx:
            trial = _plateau_trial(reference)(ctx)
            trainer_api.Trainer(trial, ctx).fit(
                max_length=reference.Epoch(6),
                validation_period=reference.Epoch(1),
                checkpoint_policy="none",
            )
            lrs[name] = [trial.opt.param_groups[0]["lr"], trial.model.weight.detach().clone()]
    assert lrs["bridge"][0] == lrs["determined"][0] < 0.1
    torch.testing.assert_close(lrs["bridge"][1], lrs["determined"][1], rtol=1e-6, atol=1e-7)
