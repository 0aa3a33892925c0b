"""LightningModules used by the adapter tests, and runners for the three ways to train them.

`run_lightning` trains a module with `lightning.Trainer(max_epochs=...)` (validation every
epoch, no sanity check), `run_trial` trains `lightning_trial(...)` with a `Trainer` of the given
API (`lightning_bridge` or `determined.pytorch`) for the same number of epochs, validating
every epoch. Both return the final weights and the metrics seen.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > x[:, 3:].sum(1)).long() + (x[:, 0] > 1).long()
    return TensorDataset(x, y)


class Net(pl.LightningModule):
    """Classifier with a shuffled loader, a step-interval scheduler and torchmetrics."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8, hidden: int = 16) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.body = torch.nn.Linear(6, hidden)
        self.head = torch.nn.Linear(hidden, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        self.lr = lr
        self.batch_size = batch_size
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        self.train_acc(out, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self(x)
        self.val_acc(out, y)
        self.log("val_loss", torch.nn.functional.cross_entropy(out, y))
        self.log("val_acc", self.val_acc)
        self.log("val_max", out.max(), reduce_fx="max")
        self.log("val_count", float(len(y)), reduce_fx="sum")

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            make_data(60, 1),
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
        )

    def val_dataloader(self) -> DataLoader:
        # 26 records in batches of 8: the last batch is smaller, so weighting by batch size
        # matters for the epoch mean.
        return DataLoader(make_data(26, 2), batch_size=8)


class PlateauNet(Net):
    """Adam with ReduceLROnPlateau on the validation loss, epoch interval."""

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val_loss"}


class ManualNet(Net):
    """Manual optimization: two optimizers, clipping, a scheduler stepped by hand."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8, hidden: int = 16) -> None:
        super().__init__(lr=lr, batch_size=batch_size, hidden=hidden)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        opt_body, opt_head = self.optimizers()  # type: ignore[misc]
        sched = self.lr_schedulers()
        for opt in (opt_body, opt_head):
            self.toggle_optimizer(opt)
            loss = torch.nn.functional.cross_entropy(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt.step()
            self.untoggle_optimizer(opt)
        sched.step()  # type: ignore[union-attr]
        self.log("train_loss", loss)

    def configure_optimizers(self) -> Any:
        opt_body = torch.optim.SGD(self.body.parameters(), lr=self.lr, momentum=0.5)
        opt_head = torch.optim.Adam(self.head.parameters(), lr=self.lr / 10)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt_body, gamma=0.97)
        return [opt_body, opt_head], [sched]


class DataModule(pl.LightningDataModule):
    """Loaders of `Net`, from a data module (built from hparams: `batch_size`)."""

    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.setup_stages: list[str] = []

    def setup(self, stage: str) -> None:
        self.setup_stages.append(stage)
        self.train_set = make_data(60, 1)
        self.val_set = make_data(26, 2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(3),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=8)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def max_weight_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between two sets of named weights (tensors or lists)."""
    assert a.keys() == b.keys()
    return max(float((torch.as_tensor(a[k]) - torch.as_tensor(b[k])).abs().max()) for k in a)


def run_lightning(
    module: pl.LightningModule, epochs: int = 2, datamodule: Any = None, **kwargs: Any
) -> list[dict[str, float]]:
    """Train with lightning.Trainer; return the callback metrics after each validation."""
    seen: list[dict[str, float]] = []

    class Record(pl.Callback):
        def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    pl.Trainer(
        max_epochs=epochs,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record()],
        **kwargs,
    ).fit(module, datamodule=datamodule)
    return seen


def run_trial(
    api: ModuleType,
    trial_cls: type,
    hparams: dict[str, Any],
    epochs: int = 2,
    **init_kwargs: Any,
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """Train `trial_cls` with `api.Trainer`; return the trial, training and validation metrics."""
    train: list[dict[str, Any]] = []
    val: list[dict[str, Any]] = []

    class Record(api.PyTorchCallback):  # type: ignore[name-defined, misc]
        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            train.append(dict(avg_metrics))

        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            val.append(dict(metrics))

    with api.init(hparams=hparams, enable_tensorboard_logging=False, **init_kwargs) as ctx:
        trial = trial_cls(ctx)
        own = trial.build_callbacks
        trial.build_callbacks = lambda: {**own(), "record": Record()}
        api.Trainer(trial, ctx).fit(
            max_length=api.Epoch(epochs),
            validation_period=api.Epoch(1),
            reporting_period=api.Epoch(1),
            checkpoint_period=api.Epoch(epochs),
        )
    return trial, train, val


BRIDGE_INIT = {"trainer_kwargs": {"enable_progress_bar": False, "enable_model_summary": False}}
