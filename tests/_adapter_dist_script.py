"""A ported LightningModule trained as a trial, one process per rank (or one process alone).

Run by tests/test_adapter_distributed.py: `python _adapter_dist_script.py OUT MODE SHUFFLE`
with MODE `single` (one process), `lightning` (two processes started by Lightning's launcher
through `init(devices=2)`) or `torchrun` (started by torchrun). Each rank writes
`OUT.<rank>.json`: its final weights, the training sample ids it saw per epoch, the
validation metrics the trial reported and `self.trainer.callback_metrics` as the module saw
them at the end of each validation.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

import lightning_bridge as pytorch

N_TRAIN = 112  # 3.5 batches of 32: the last batch of an epoch is smaller
N_VAL = 50  # 1.6 batches of 32; even, so two processes split it without padding
GLOBAL_BATCH = 32
EPOCHS = 2


def _data(n: int, seed: int) -> TensorDataset:
    """Features, a 3-class label and each record's id (to see which process trained on it)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > x[:, 3:].sum(1)).long() + (x[:, 0] > 1).long()
    return TensorDataset(x, y, torch.arange(n))


class DistNet(pl.LightningModule):
    """Automatic optimization, SGD, a step-interval StepLR, torchmetrics accuracy; no dropout."""

    def __init__(self, lr: float = 0.2) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.body = torch.nn.Linear(6, 16)
        self.head = torch.nn.Linear(16, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        self.lr = lr
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
        self.seen: dict[int, list[int]] = {}
        self.callback_metrics_seen: list[dict[str, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, ids = batch
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in ids)
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y, _ = batch
        out = self(x)
        self.val_acc(out, y)
        self.log("val_loss", torch.nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", self.val_acc)
        self.log("val_count", float(len(y)), reduce_fx="sum", sync_dist=True)
        # Not synced: this process's own count in callback_metrics.
        self.log("val_local_count", float(len(y)), reduce_fx="sum")

    def on_validation_end(self) -> None:
        metrics = self.trainer.callback_metrics
        self.callback_metrics_seen.append({k: float(v) for k, v in metrics.items()})

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class DistData(pl.LightningDataModule):
    """`batch_size` is the per-process batch size (from `global_batch_size`)."""

    def __init__(self, batch_size: int = GLOBAL_BATCH, shuffle: bool = False) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.shuffle = shuffle

    def setup(self, stage: str) -> None:
        self.train_set = _data(N_TRAIN, 1)
        self.val_set = _data(N_VAL, 2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


DistNetTrial = pytorch.lightning_trial(DistNet, DistData)


class _Record(pytorch.PyTorchCallback):
    def __init__(self) -> None:
        self.val: list[dict[str, float]] = []

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.val.append({k: float(v) for k, v in metrics.items()})


def main(out: str, mode: str, shuffle: bool) -> None:
    engine: dict[str, Any] = {}
    if mode == "lightning":
        engine = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
    hparams = {"global_batch_size": GLOBAL_BATCH, "lr": 0.2, "shuffle": shuffle}
    trainer_kwargs = {"enable_progress_bar": False, "enable_model_summary": False}
    record = _Record()
    with pytorch.init(
        hparams=hparams,
        trainer_kwargs=trainer_kwargs,
        enable_tensorboard_logging=False,
        **engine,
    ) as ctx:
        trial = DistNetTrial(ctx)
        own = trial.build_callbacks
        trial.build_callbacks = lambda: {**own(), "record": record}
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Epoch(EPOCHS),
            validation_period=pytorch.Epoch(1),
            reporting_period=pytorch.Epoch(1),
            checkpoint_period=pytorch.Epoch(EPOCHS),
        )
        module = trial.lightning_module
        result = {
            "rank": ctx.distributed.rank,
            "size": ctx.distributed.size,
            "per_slot_batch": ctx.get_per_slot_batch_size(),
            "weights": {k: v.detach().flatten().tolist() for k, v in module.state_dict().items()},
            "lr": trial.optimizers[0].param_groups[0]["lr"],
            "seen": {str(k): v for k, v in module.seen.items()},
            "val": record.val,
            "callback_metrics": module.callback_metrics_seen,
        }
    with open(f"{out}.{result['rank']}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "shuffle")
