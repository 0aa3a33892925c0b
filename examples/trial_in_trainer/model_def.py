"""A PyTorchTrial that classifies scikit-learn's 8x8 handwritten digits: Determined code, kept
as it is. `train.py` trains it inside a `lightning.Trainer` built by hand;
`lightning-bridge run const.yaml` (or `det e create const.yaml .` on a cluster) runs it as an
experiment.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

try:
    from determined import pytorch
except ImportError:  # without Determined: the bridge stands in for `determined.pytorch`
    import lightning_bridge as pytorch  # type: ignore[no-redef]

NUM_CLASSES = 10
SPLIT_SEED = 0  # the train / validation split is fixed, whatever the trial seed


def digits_datasets() -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """1797 digit images as 64 features in [0, 1], split 80/20 with the classes balanced."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(
        features, labels, test_size=0.2, random_state=SPLIT_SEED, stratify=labels
    )

    def dataset(x: np.ndarray, y: np.ndarray) -> torch.utils.data.Dataset:
        return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    return dataset(x_train, y_train), dataset(x_val, y_val)


class DigitsTrial(pytorch.PyTorchTrial):
    def __init__(self, context: Any) -> None:
        self.context = context
        hidden = context.get_hparam("hidden_size")
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Linear(64, hidden),
                nn.ReLU(),
                nn.Dropout(context.get_hparam("dropout")),
                nn.Linear(hidden, NUM_CLASSES),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(
                self.model.parameters(),
                lr=context.get_hparam("learning_rate"),
                momentum=context.get_hparam("momentum"),
            )
        )
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(
                self.optimizer, step_size=1, gamma=context.get_hparam("lr_gamma")
            ),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )
        self.train_data, self.val_data = digits_datasets()

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(
            self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(self.val_data, batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        logits = self.model(x)
        return {
            "validation_loss": nn.functional.cross_entropy(logits, y),
            "validation_accuracy": (logits.argmax(dim=1) == y).float().mean(),
        }
