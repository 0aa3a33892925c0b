"""LightningModules of the kinds real projects are made of, each with the Trainer it expects.

Written in the style of public tutorials (a classifier with OneCycleLR, a GAN, an autoencoder,
modules with EarlyStopping / ModelCheckpoint, gradient accumulation, SWA, ...), kept tiny.
Each `Case` says how `lightning.Trainer` trains the module (`trainer`) and how the same
project is given to a trial (`hparams`, the experiment config's length and validation period,
the trial's aggregation, Trainer callbacks for `lightning_trial(callbacks=...)`).
`tests/_zoo_runner.py` trains each case three ways.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import pytorch_lightning
import torch
import torchmetrics
from lightning.pytorch.callbacks import (
    EarlyStopping,
    GradientAccumulationScheduler,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def blobs(n: int, seed: int) -> TensorDataset:
    """Three classes of points in 6 dimensions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > x[:, 3:].sum(1)).long() + (x[:, 0] > 1).long()
    return TensorDataset(x, y)


def ring(n: int, seed: int) -> TensorDataset:
    """Points around eight centres on a circle (a GAN's data)."""
    g = torch.Generator().manual_seed(seed)
    angle = torch.randint(0, 8, (n,), generator=g).float() * (2 * math.pi / 8)
    centres = torch.stack([angle.cos(), angle.sin()], dim=1) * 2
    return TensorDataset(centres + 0.05 * torch.randn(n, 2, generator=g))


def _init(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


# ----- a tutorial classifier and its variants ------------------------------------------------


class LitClassifier(pl.LightningModule):
    """An MLP classifier: Adam, OneCycleLR over `estimated_stepping_batches`, accuracy."""

    def __init__(self, lr: float = 0.01, hidden: int = 16, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        _init(self.net, 0)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        loss = F.cross_entropy(logits, y)
        self.log("val_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=self.hparams.lr * 5,
            total_steps=self.trainer.estimated_stepping_batches,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(3)
        return DataLoader(
            blobs(48, 1), batch_size=self.hparams.batch_size, shuffle=True, generator=generator
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(blobs(20, 2), batch_size=8)


class EpochsOneCycle(LitClassifier):
    """OneCycleLR(epochs=max_epochs, steps_per_epoch=...) with SGD."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        epochs = self.trainer.max_epochs
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=0.1,
            epochs=epochs,
            steps_per_epoch=math.ceil(self.trainer.estimated_stepping_batches / epochs),
        )
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


class EarlyStopped(LitClassifier):
    """EarlyStopping on val_loss from configure_callbacks, with a constant learning rate."""

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def configure_callbacks(self) -> Any:
        return [EarlyStopping(monitor="val_loss", min_delta=0.05, patience=1)]


class Checkpointed(LitClassifier):
    """ModelCheckpoint on the best val_acc, and a step decay."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)]

    def configure_callbacks(self) -> Any:
        return ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=1)


class Accumulating(LitClassifier):
    """Gradient accumulation and clipping (Trainer arguments), a per-epoch scheduler."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class Plateau(LitClassifier):
    """ReduceLROnPlateau on val_loss."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val_loss"}


class SparsePlateau(LitClassifier):
    """ReduceLROnPlateau on val_loss where not every epoch validates (strict=False)."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        config = {"scheduler": scheduler, "monitor": "val_loss", "strict": False}
        return {"optimizer": optimizer, "lr_scheduler": config}


class LossScaledLR(Plateau):
    """EMA weights for validation, and a learning rate set from the epoch's val_loss in
    on_train_epoch_end: the weights depend on validation running before that hook."""

    def __init__(self, lr: float = 0.01, hidden: int = 16, batch_size: int = 8) -> None:
        super().__init__(lr=lr, hidden=hidden, batch_size=batch_size)
        self.ema = torch.optim.swa_utils.AveragedModel(
            self.net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.5)
        )

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.ema(x), y))

    def on_train_epoch_end(self) -> None:
        self.ema.update_parameters(self.net)
        val_loss = float(self.trainer.callback_metrics["val_loss"])
        for group in self.optimizers().optimizer.param_groups:
            group["lr"] = self.hparams.lr * min(val_loss, 2.0)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=self.hparams.lr)


class TwoValidationSets(Plateau):
    """Two validation loaders; the plateau scheduler monitors the second one's loss."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def val_dataloader(self) -> Any:
        return [DataLoader(blobs(20, 2), batch_size=8), DataLoader(blobs(12, 5), batch_size=4)]

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {
            "optimizer": optimizer,
            "lr_scheduler": scheduler,
            "monitor": "val_loss/dataloader_idx_1",
        }


class Averaged(LitClassifier):
    """Stochastic weight averaging from the second epoch (a Trainer callback)."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)]


class Monitored(Averaged):
    """LearningRateMonitor and a user callback that freezes the first layer after an epoch."""


class FreezeFirstLayer(pl.Callback):
    """A user callback: the first layer stops training after the first epoch."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch >= 1:
            pl_module.net[0].requires_grad_(False)


# ----- modules without validation_step ------------------------------------------------------


class LitGAN(pl.LightningModule):
    """A GAN on a ring of Gaussians: manual optimization, two optimizers, no validation."""

    def __init__(self, lr: float = 0.01, latent: int = 4, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 16), nn.ReLU(), nn.Linear(16, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        _init(self, 1)
        self.noise = torch.Generator().manual_seed(7)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent, generator=self.noise)
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        d_loss = (
            F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
            + F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)
        ) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def configure_optimizers(self) -> Any:
        lr = self.hparams.lr
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
        return [opt_g, opt_d], []

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(4)
        return DataLoader(
            ring(64, 3), batch_size=self.hparams.batch_size, shuffle=True, generator=generator
        )


class LitAutoEncoder(pl.LightningModule):
    """An autoencoder pretraining run: no validation, ReduceLROnPlateau on the training loss."""

    def __init__(self, lr: float = 0.05, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(6, 3), nn.Tanh())
        self.decoder = nn.Linear(3, 6)
        _init(self, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        loss = F.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "train_loss"},
        }

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(40, 6), batch_size=self.hparams.batch_size)


class NoisyPretraining(pl.LightningModule):
    """A denoising pretraining run: global-RNG noise (torch.randn) and dropout, no validation."""

    def __init__(self, lr: float = 0.05, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.3))
        self.decoder = nn.Linear(8, 6)
        _init(self, 5)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        noisy = x + 0.1 * torch.randn_like(x)
        loss = F.mse_loss(self.decoder(self.encoder(noisy)), x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(40, 8), batch_size=self.hparams.batch_size, shuffle=True)


# ----- the same tutorial on the pytorch_lightning package -----------------------------------


class PLClassifier(pytorch_lightning.LightningModule):
    """`import pytorch_lightning as pl`: a classifier with a data module and a callback."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
        _init(self.net, 3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


class PLData(pytorch_lightning.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = blobs(40, 7), blobs(16, 8)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(5)
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class PLWeightDecayWarmup(pytorch_lightning.Callback):
    """A pytorch_lightning callback: weight decay switched on after the first epoch."""

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for group in trainer.optimizers[0].param_groups:
            group["weight_decay"] = 0.0 if trainer.current_epoch == 0 else 0.01


# ----- the cases ------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """A module, how lightning.Trainer trains it, and how a trial is given the same."""

    name: str
    exercises: str
    module: type
    hparams: dict[str, Any]
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict)
    epochs: int = 3
    length_unit: str = "epochs"
    validate_every: int = 1
    validate_unit: str = "epochs"
    aggregation: int = 1
    callbacks: Callable[[], list[Any]] = list
    datamodule: type | None = None
    metric: str = "val_loss"
    smaller_is_better: bool = True

    def package(self) -> Any:
        """The Lightning package the module is written against."""
        if issubclass(self.module, pytorch_lightning.LightningModule):
            return pytorch_lightning
        return pl

    def lightning_trainer(self) -> Any:
        kwargs = {
            "max_epochs": self.epochs,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_checkpointing": self.module is Checkpointed,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": self.callbacks(),
            **self.trainer,
        }
        return self.package().Trainer(**kwargs)

    def constructor_hparams(self, cls: type) -> dict[str, Any]:
        import inspect

        names = set(inspect.signature(cls).parameters)
        return {k: v for k, v in self.hparams.items() if k in names}


CASES = [
    Case(
        "onecycle",
        "OneCycleLR(total_steps=trainer.estimated_stepping_batches); on_step+on_epoch names",
        LitClassifier,
        {"global_batch_size": 8, "lr": 0.01},
    ),
    Case(
        "onecycle_epochs_in_batches",
        "OneCycleLR(epochs=trainer.max_epochs, "
        "steps_per_epoch=trainer.num_training_batches), length in batches",
        EpochsOneCycle,
        {"global_batch_size": 8, "lr": 0.05},
        length_unit="batches",
        trainer={"max_steps": 18},
    ),
    Case(
        "gan",
        "no validation_step, manual optimization, two optimizers",
        LitGAN,
        {"global_batch_size": 16, "lr": 0.01},
        metric="g_loss",
    ),
    Case(
        "autoencoder",
        "no validation_step, ReduceLROnPlateau on a training epoch value",
        LitAutoEncoder,
        {"global_batch_size": 8, "lr": 0.05},
        epochs=4,
        metric="train_loss",
    ),
    Case(
        "noisy_no_validation",
        "no validation_step, torch.randn noise, dropout and a shuffling loader on the global RNG",
        NoisyPretraining,
        {"global_batch_size": 8, "lr": 0.05},
        metric="train_loss",
    ),
    Case(
        "early_stopping",
        "EarlyStopping(val_loss) from configure_callbacks",
        EarlyStopped,
        {"global_batch_size": 8, "lr": 0.3},
        epochs=8,
    ),
    Case(
        "model_checkpoint",
        "ModelCheckpoint(val_acc, max) -> searcher metric",
        Checkpointed,
        {"global_batch_size": 8, "lr": 0.05},
        metric="val_acc",
        smaller_is_better=False,
    ),
    Case(
        "pytorch_lightning",
        "pytorch_lightning module, data module and callback",
        PLClassifier,
        {"global_batch_size": 8, "lr": 0.05},
        datamodule=PLData,
        callbacks=lambda: [PLWeightDecayWarmup()],
    ),
    Case(
        "accumulate_clip",
        "accumulate_grad_batches=4 (not dividing the epoch), gradient_clip_val",
        Accumulating,
        {"global_batch_size": 8, "lr": 0.1, "accumulate_grad_batches": 4, "gradient_clip_val": 0.3},
        trainer={"accumulate_grad_batches": 4, "gradient_clip_val": 0.3},
    ),
    Case(
        "aggregation_frequency",
        "optimizations.aggregation_frequency=2 as accumulate_grad_batches=2",
        Accumulating,
        {"global_batch_size": 8, "lr": 0.1},
        trainer={"accumulate_grad_batches": 2},
        aggregation=2,
    ),
    Case(
        "accumulation_scheduler",
        "GradientAccumulationScheduler({0: 1, 1: 3})",
        Accumulating,
        {"global_batch_size": 8, "lr": 0.1},
        callbacks=lambda: [GradientAccumulationScheduler({0: 1, 1: 3})],
    ),
    Case(
        "swa",
        "StochasticWeightAveraging(swa_epoch_start=2)",
        Averaged,
        {"global_batch_size": 8, "lr": 0.1},
        epochs=4,
        callbacks=lambda: [StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2)],
    ),
    Case(
        "lr_monitor_user_callback",
        "LearningRateMonitor, a user Callback",
        Monitored,
        {"global_batch_size": 8, "lr": 0.1},
        callbacks=lambda: [LearningRateMonitor("step"), FreezeFirstLayer()],
        trainer={"logger": True},
    ),
    Case(
        "epoch_end_order",
        "on_train_epoch_end after the epoch's validation (EMA, lr from val_loss)",
        LossScaledLR,
        {"global_batch_size": 8, "lr": 0.1},
    ),
    Case(
        "two_val_loaders",
        "two validation loaders, plateau on val_loss/dataloader_idx_1",
        TwoValidationSets,
        {"global_batch_size": 8, "lr": 0.05},
        metric="val_loss/dataloader_idx_0",
    ),
    Case(
        "validate_every_2",
        "check_val_every_n_epoch=2 with ReduceLROnPlateau",
        SparsePlateau,
        {"global_batch_size": 8, "lr": 0.05},
        epochs=4,
        validate_every=2,
        trainer={"check_val_every_n_epoch": 2},
    ),
    Case(
        "validate_every_4_batches",
        "val_check_interval=4 batches across epochs (check_val_every_n_epoch=None)",
        SparsePlateau,
        {"global_batch_size": 8, "lr": 0.05},
        epochs=4,
        validate_every=4,
        validate_unit="batches",
        trainer={"val_check_interval": 4, "check_val_every_n_epoch": None},
    ),
    Case(
        "limit_batches",
        "limit_train_batches=4 (OneCycleLR over the limited epochs), limit_val_batches=0.5, "
        "num_sanity_val_steps=0, log_every_n_steps=2 as hparams",
        LitClassifier,
        {
            "global_batch_size": 8,
            "lr": 0.01,
            "limit_train_batches": 4,
            "limit_val_batches": 0.5,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 2,
        },
        trainer={"limit_train_batches": 4, "limit_val_batches": 0.5, "log_every_n_steps": 2},
    ),
    Case(
        "val_check_interval_hparam",
        "val_check_interval=0.5 as an hparam: every 3 of an epoch's 6 batches",
        SparsePlateau,
        {"global_batch_size": 8, "lr": 0.05, "val_check_interval": 0.5},
        epochs=2,
        validate_every=3,
        validate_unit="batches",
        trainer={"val_check_interval": 0.5},
    ),
    Case(
        "limit_fractions",
        "limit_train_batches=0.67 (4 of 6 batches), limit_val_batches=2, val_check_interval=2 "
        "as hparams",
        SparsePlateau,
        {
            "global_batch_size": 8,
            "lr": 0.05,
            "limit_train_batches": 0.67,
            "limit_val_batches": 2,
            "val_check_interval": 2,
        },
        epochs=2,
        validate_every=2,
        validate_unit="batches",
        trainer={"limit_train_batches": 0.67, "limit_val_batches": 2, "val_check_interval": 2},
    ),
    Case(
        "bf16_mixed",
        "precision='bf16-mixed'",
        Plateau,
        {"global_batch_size": 8, "lr": 0.05, "precision": "bf16-mixed"},
        trainer={"precision": "bf16-mixed"},
    ),
    Case(
        "double",
        "precision='64-true'",
        LitClassifier,
        {"global_batch_size": 8, "lr": 0.01, "precision": "64-true"},
        trainer={"precision": "64-true"},
    ),
]
