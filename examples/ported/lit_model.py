"""A LightningModule that classifies 8x8 digit images: plain Lightning, no Determined code."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy


class LitClassifier(pl.LightningModule):
    """A two-layer MLP trained with SGD and a per-epoch step decay of the learning rate."""

    def __init__(
        self,
        hidden_size: int = 128,
        dropout: float = 0.2,
        learning_rate: float = 0.05,
        momentum: float = 0.9,
        lr_gamma: float = 0.8,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Linear(64, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, num_classes),
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.val_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        features, labels = batch
        logits = self(features)
        loss = self.loss_fn(logits, labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, labels = batch
        logits = self(features)
        self.val_accuracy(logits, labels)
        self.log("val_accuracy", self.val_accuracy, prog_bar=True)
        self.log("val_loss", self.loss_fn(logits, labels), prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(
            self.parameters(), lr=self.hparams.learning_rate, momentum=self.hparams.momentum
        )
        scheduler = torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=1, gamma=self.hparams.lr_gamma
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"},
        }
