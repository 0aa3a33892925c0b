"""A PyTorchTrial that classifies scikit-learn's 8x8 handwritten digits.

The trial is plain Determined code, unchanged: `lightning-bridge run const.yaml` runs it on
Lightning (mapping `from determined import pytorch` onto the bridge when Determined is not
installed), and `det e create const.yaml .` would run it on a Determined cluster.

Shown here: hyperparameters from the context, a model / optimizer / LR scheduler wrapped by the
context, training and validation data loaders, per-batch validation metrics, and a custom
`MetricReducer` built on torchmetrics that stays exact when validation is split across several
processes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from determined import pytorch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torchmetrics.classification import MulticlassConfusionMatrix

NUM_CLASSES = 10
# The train / validation split is fixed, whatever the trial seed.
SPLIT_SEED = 0
VALIDATION_FRACTION = 0.2


def digits_datasets() -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """1797 digit images as 64 features in [0, 1], split 80/20 with the classes balanced."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        features,
        labels,
        test_size=VALIDATION_FRACTION,
        random_state=SPLIT_SEED,
        stratify=labels,
    )
    train = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    val = torch.utils.data.TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val))
    return train, val


class MacroF1(pytorch.MetricReducer):
    """Macro-averaged F1 over the whole validation set.

    Every process accumulates a torchmetrics confusion matrix of the batches it validated; the
    matrices are summed across processes before F1 is computed, so the value is the one a single
    process would get on the full set (averaging per-process F1 scores would not be).
    """

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.num_classes = num_classes
        self.confusion = MulticlassConfusionMatrix(num_classes=num_classes).to(device)

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        self.confusion.update(predictions, labels)

    def reset(self) -> None:
        self.confusion.reset()

    def per_slot_reduce(self) -> torch.Tensor:
        # The metric's state: counts[true class, predicted class] for this process.
        if self.confusion.update_count == 0:
            return torch.zeros(self.num_classes, self.num_classes, dtype=torch.long)
        return self.confusion.compute().cpu()

    def cross_slot_reduce(self, per_slot_metrics: list[torch.Tensor]) -> float:
        counts = torch.stack(per_slot_metrics).sum(dim=0).double()
        true_positives = counts.diag()
        # 2 TP / (2 TP + FP + FN) = 2 TP / (true count + predicted count), per class.
        denominator = counts.sum(dim=1) + counts.sum(dim=0)
        seen = denominator > 0  # a class never labelled nor predicted does not count
        if not bool(seen.any()):
            return 0.0
        return float((2 * true_positives[seen] / denominator[seen]).mean())


class DigitsTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.train_data, self.val_data = digits_datasets()

        hidden = int(context.get_hparam("hidden_size"))
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Linear(64, hidden),
                nn.ReLU(),
                nn.Dropout(float(context.get_hparam("dropout"))),
                nn.Linear(hidden, NUM_CLASSES),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(
                self.model.parameters(),
                lr=float(context.get_hparam("learning_rate")),
                momentum=float(context.get_hparam("momentum")),
            )
        )
        self.lr_scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(
                self.optimizer, step_size=1, gamma=float(context.get_hparam("lr_gamma"))
            ),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.macro_f1 = context.wrap_reducer(
            MacroF1(NUM_CLASSES, context.device), name="val_macro_f1", for_training=False
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            self.val_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=False
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        features, labels = batch
        logits = self.model(features)
        loss = self.loss_fn(logits, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        return {"loss": loss, "train_accuracy": accuracy}

    def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        features, labels = batch
        logits = self.model(features)
        predictions = logits.argmax(dim=1)
        self.macro_f1.update(predictions, labels)
        return {
            "validation_loss": self.loss_fn(logits, labels),
            "validation_accuracy": (predictions == labels).float().mean(),
        }
