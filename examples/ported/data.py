"""A LightningDataModule for scikit-learn's 8x8 handwritten digits (bundled, nothing downloaded)."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset


class DigitsDataModule(pl.LightningDataModule):
    """1797 images as 64 features in [0, 1], split into training and validation sets.

    The split is stratified and fixed by `split_seed`, whatever the training seed.
    """

    def __init__(self, batch_size: int = 32, val_fraction: float = 0.2, split_seed: int = 0):
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.split_seed = split_seed

    def setup(self, stage: str) -> None:
        digits = load_digits()
        features = (digits.data / 16.0).astype(np.float32)
        labels = digits.target.astype(np.int64)
        x_train, x_val, y_train, y_val = train_test_split(
            features,
            labels,
            test_size=self.val_fraction,
            random_state=self.split_seed,
            stratify=labels,
        )
        self.train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
        self.val_set = TensorDataset(torch.from_numpy(x_val), torch.from_numpy(y_val))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)
