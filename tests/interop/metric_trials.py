"""Trials whose metrics Determined accepts beyond plain scalars, for either API.

`make_trials(pytorch)` builds them against the given API module, so the reference and the
bridge train the same code: training metrics that are strings, None or vectors; validation
metrics that are lists of tensors, nested lists and arrays; a full-dataset evaluation returning
non-scalars; and a subclass that switches its parent's `evaluate_batch` off by restoring the
base method (Determined's test of "overridden"). `run(pytorch, cls)` fits one for 4 batches
and returns what the callbacks saw.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import torch

N, BATCH = 16, 4


def _data(seed: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 3, generator=gen)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def make_trials(pytorch: ModuleType) -> dict[str, type]:
    class Base(pytorch.PyTorchTrial):  # type: ignore[misc,name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            torch.manual_seed(1)
            self.model = context.wrap_model(torch.nn.Linear(3, 1))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

        def _loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            loss = self._loss(batch)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {
                "loss": loss,
                "note": f"batch {batch_idx}",
                "sometimes": None if batch_idx % 2 else float(batch_idx),
                "never": None,
                "vec": torch.stack([loss, 2 * loss]).detach(),
            }

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            loss = self._loss(batch)
            return {
                "val_loss": loss,
                "pair": [loss, loss * 2],
                "nested": [[1.0, float(batch_idx)], [3.0, 4.0]],
                "grid": np.full((2, 3), float(batch_idx)),
            }

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(_data(0), batch_size=BATCH)

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(_data(1), batch_size=BATCH)

    class FullDataset(Base):
        evaluate_batch = pytorch.PyTorchTrial.evaluate_batch  # switches the parent's off

        def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
            losses = [self._loss(b) for b in data_loader]
            return {
                "val_loss": torch.stack(losses).mean(),
                "per_batch": losses,
                "nested": [[1, 2], [3]],
                "label": "full",
            }

    return {"Base": Base, "FullDataset": FullDataset}


def plain(value: Any) -> Any:
    """A comparable form: tensors and arrays as (dtype kind, nested lists), NaN as "nan"."""
    if isinstance(value, torch.Tensor):
        return ["tensor", plain(value.detach().numpy())]
    if isinstance(value, np.ndarray):
        return ["ndarray", value.dtype.kind, plain(value.tolist())]
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float) and np.isnan(value):
        return "nan"
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def run(pytorch: ModuleType, name: str) -> dict[str, Any]:
    seen: dict[str, Any] = {"avg": [], "batch": [], "val": [], "val_objects": []}

    class Record(pytorch.PyTorchCallback):  # type: ignore[misc,name-defined]
        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            seen["avg"].append(plain(avg_metrics))
            seen["batch"].append(plain(batch_metrics))

        def on_validation_end(self, metrics: Any) -> None:
            seen["val"].append(plain(metrics))
            seen["val_objects"].append(metrics)  # the dict itself: what is added to it later

    trial_cls = make_trials(pytorch)[name]

    class Recorded(trial_cls):  # type: ignore[misc,valid-type]
        def build_callbacks(self) -> dict[str, Any]:
            return {"record": Record()}

    with pytorch.init() as context:
        trainer = pytorch.Trainer(Recorded(context), context)
        trainer.fit(
            max_length=pytorch.Batch(4),
            reporting_period=pytorch.Batch(2),
            validation_period=pytorch.Batch(2),
            checkpoint_policy="none",
        )
    seen["val_after"] = [plain(m) for m in seen.pop("val_objects")]
    return seen
