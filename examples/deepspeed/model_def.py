"""A DeepSpeedTrial: a small regression network trained on DeepSpeed's engine.

The DeepSpeed config is `ds_config.json` with the hyperparameters' `overwrite_deepspeed_args`
merged over it (`det_ds.overwrite_deepspeed_config`); the trial builds its engine with
`deepspeed.initialize` and hands it to the context. The data is generated (a noisy linear
function of 8 inputs): nothing is downloaded.
"""

from collections.abc import Iterator
from typing import Any

import deepspeed
import torch
from determined import pytorch
from determined.pytorch import deepspeed as det_ds
from torch import nn
from torch.utils.data import TensorDataset

INPUTS = 8


def make_dataset(rows: int, seed: int) -> TensorDataset:
    """`rows` points of y = x . w / 8 + noise, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, INPUTS, generator=g)
    w = torch.arange(1.0, INPUTS + 1.0).unsqueeze(1)
    y = x @ w / INPUTS + 0.1 * torch.randn(rows, 1, generator=g)
    return TensorDataset(x, y)


class RegressionTrial(det_ds.DeepSpeedTrial):
    def __init__(self, context: det_ds.DeepSpeedTrialContext) -> None:
        self.context = context
        hparams = context.get_hparams()
        ds_config = det_ds.overwrite_deepspeed_config(
            hparams["deepspeed_config"], hparams.get("overwrite_deepspeed_args", {})
        )
        hidden = int(hparams["hidden_size"])
        model = nn.Sequential(nn.Linear(INPUTS, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config
        )
        self.engine = context.wrap_model_engine(engine)

    def train_batch(
        self, dataloader_iter: Iterator[Any] | None, epoch_idx: int, batch_idx: int
    ) -> dict[str, Any]:
        assert dataloader_iter is not None
        x, y = self.context.to_device(next(dataloader_iter))
        loss = nn.functional.mse_loss(self.engine(x), y)
        self.engine.backward(loss)
        self.engine.step()
        return {"loss": loss}

    def evaluate_batch(
        self, dataloader_iter: Iterator[Any] | None, batch_idx: int
    ) -> dict[str, Any]:
        assert dataloader_iter is not None
        x, y = self.context.to_device(next(dataloader_iter))
        return {"val_loss": nn.functional.mse_loss(self.engine(x), y)}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            make_dataset(1024, seed=0),
            batch_size=self.context.get_train_micro_batch_size_per_gpu(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            make_dataset(256, seed=1), batch_size=self.context.get_train_micro_batch_size_per_gpu()
        )
