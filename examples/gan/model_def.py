"""A GAN on a ring of eight Gaussians, written as a Determined `PyTorchTrial`.

This is unchanged Determined code (`from determined import pytorch`): `lightning-bridge run`
trains it on Lightning, `det experiment create` trains it on a Determined cluster.

Shown here: two wrapped models (generator, discriminator) with two wrapped optimizers, a
`context.backward` / `context.step_optimizer` pair per model in one `train_batch`, training
metrics for both losses, and validation metrics that say how good the generated samples are,
including a `MetricReducer` that counts samples per mode across every process.

The data is generated, not downloaded: points drawn around eight centres evenly spaced on a
circle, from a fixed seed. A generator that learns the distribution puts its samples close to
the centres (`val_mode_distance` falls towards the data's own spread) and on all eight of
them (`val_modes_covered` reaches 1.0); a collapsed generator covers one or two.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from determined import pytorch
from torch import nn

NUM_MODES = 8
RING_RADIUS = 2.0
MODE_STD = 0.05
# The data and the validation noise are fixed, whatever the trial seed.
DATA_SEED = 0
VALIDATION_SEED = 1
# A sample is "high quality" within this many standard deviations of its nearest centre.
HIGH_QUALITY_STDS = 3.0
# A mode counts as covered when it holds at least this share of its fair share (1 / modes) of
# the high-quality samples.
COVERED_SHARE = 0.25


def mode_centres() -> torch.Tensor:
    """The eight centres, evenly spaced on a circle of radius `RING_RADIUS`."""
    angles = torch.arange(NUM_MODES, dtype=torch.float64) * (2 * math.pi / NUM_MODES)
    return (RING_RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)).float()


def ring_samples(count: int, seed: int) -> torch.Tensor:
    """`count` points: a uniformly chosen centre plus Gaussian noise of std `MODE_STD`."""
    generator = torch.Generator().manual_seed(seed)
    modes = torch.randint(NUM_MODES, (count,), generator=generator)
    noise = torch.randn(count, 2, generator=generator) * MODE_STD
    return mode_centres()[modes] + noise


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, outputs),
    )


class ModeCoverage(pytorch.MetricReducer):
    """High-quality samples per mode, summed over every process's validation batches.

    Reports `val_modes_covered` (fraction of the modes holding at least `COVERED_SHARE` of a
    fair share of the high-quality samples) and `val_high_quality` (fraction of all samples
    within `HIGH_QUALITY_STDS` standard deviations of a centre).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.per_mode = torch.zeros(NUM_MODES, dtype=torch.long)
        self.total = 0

    def update(self, nearest_mode: torch.Tensor, high_quality: torch.Tensor) -> None:
        counts = torch.bincount(nearest_mode[high_quality].cpu(), minlength=NUM_MODES)
        self.per_mode += counts
        self.total += int(nearest_mode.numel())

    def per_slot_reduce(self) -> tuple[list[int], int]:
        return self.per_mode.tolist(), self.total

    def cross_slot_reduce(self, per_slot_metrics: list) -> dict[str, float]:
        per_mode = torch.tensor([counts for counts, _ in per_slot_metrics]).sum(dim=0)
        total = sum(n for _, n in per_slot_metrics)
        if total == 0:
            return {"val_modes_covered": 0.0, "val_high_quality": 0.0}
        fair_share = total / NUM_MODES
        covered = (per_mode >= COVERED_SHARE * fair_share).float().mean()
        return {
            "val_modes_covered": float(covered),
            "val_high_quality": float(per_mode.sum()) / total,
        }


class GANTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.latent_dim = int(context.get_hparam("latent_dim"))
        hidden = int(context.get_hparam("hidden_size"))
        betas = (float(context.get_hparam("beta1")), 0.999)

        self.generator = context.wrap_model(mlp(self.latent_dim, hidden, 2))
        self.discriminator = context.wrap_model(mlp(2, hidden, 1))
        self.g_optimizer = context.wrap_optimizer(
            torch.optim.Adam(
                self.generator.parameters(), lr=float(context.get_hparam("g_lr")), betas=betas
            )
        )
        self.d_optimizer = context.wrap_optimizer(
            torch.optim.Adam(
                self.discriminator.parameters(), lr=float(context.get_hparam("d_lr")), betas=betas
            )
        )
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.coverage = context.wrap_reducer(ModeCoverage(), for_training=False)
        self.centres = mode_centres().to(context.device)

    def build_training_data_loader(self) -> pytorch.DataLoader:
        points = ring_samples(int(self.context.get_hparam("train_samples")), DATA_SEED)
        return pytorch.DataLoader(
            torch.utils.data.TensorDataset(points),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
            drop_last=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        # Validation feeds the generator a fixed set of latent vectors, so successive
        # validations compare the same samples' positions.
        generator = torch.Generator().manual_seed(VALIDATION_SEED)
        count = int(self.context.get_hparam("validation_samples"))
        noise = torch.randn(count, self.latent_dim, generator=generator)
        return pytorch.DataLoader(
            torch.utils.data.TensorDataset(noise),
            batch_size=self.context.get_per_slot_batch_size(),
        )

    def _labels(self, like: torch.Tensor, value: float) -> torch.Tensor:
        return torch.full((like.shape[0], 1), value, device=like.device)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        (real,) = batch
        noise = torch.randn(real.shape[0], self.latent_dim, device=real.device)
        fake = self.generator(noise)

        # Discriminator: real points are 1, generated points 0 (no gradient into the generator).
        d_real = self.discriminator(real)
        d_fake = self.discriminator(fake.detach())
        d_loss = self.loss_fn(d_real, self._labels(d_real, 1.0)) + self.loss_fn(
            d_fake, self._labels(d_fake, 0.0)
        )
        self.context.backward(d_loss)
        self.context.step_optimizer(self.d_optimizer)

        # Generator: make the discriminator call generated points real. The discriminator's
        # parameters are frozen meanwhile, so this loss leaves no gradient on them.
        self.discriminator.requires_grad_(False)
        d_on_fake = self.discriminator(fake)
        g_loss = self.loss_fn(d_on_fake, self._labels(d_on_fake, 1.0))
        self.context.backward(g_loss)
        self.context.step_optimizer(self.g_optimizer)
        self.discriminator.requires_grad_(True)

        return {
            "d_loss": d_loss,
            "g_loss": g_loss,
            "d_real_score": torch.sigmoid(d_real).mean(),
            "d_fake_score": torch.sigmoid(d_fake).mean(),
        }

    def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        (noise,) = batch
        samples = self.generator(noise)
        distances = torch.cdist(samples, self.centres)
        nearest_distance, nearest_mode = distances.min(dim=1)
        self.coverage.update(nearest_mode, nearest_distance <= HIGH_QUALITY_STDS * MODE_STD)
        return {"val_mode_distance": nearest_distance.mean()}
