"""What `LightningAdapter` refuses, checked when the trial is built.

Each refusal names the hook or setting and says what to do instead. docs/lightning.md has
the full table of LightningModule / LightningDataModule hooks and their status.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning.pytorch.utilities.model_helpers import is_overridden


def _aggregation_frequency(context: Any) -> int:
    try:
        config = context.get_experiment_config() or {}
    except Exception:  # no experiment config given: Determined's default applies
        return 1
    return int((config.get("optimizations") or {}).get("aggregation_frequency", 1) or 1)


def refusals(module: Any, datamodule: Any, context: Any) -> list[str]:
    """Messages for everything in `module` / `datamodule` a trial cannot run."""
    name = type(module).__name__
    out: list[str] = []
    params = inspect.signature(module.training_step).parameters
    if "dataloader_iter" in params:
        out.append(
            f"{name}.training_step(dataloader_iter) is not supported by LightningAdapter: a "
            "trial receives one batch per step. Take (batch, batch_idx) instead."
        )
    if "optimizer_idx" in params:
        out.append(
            f"{name}.training_step(optimizer_idx) is Lightning 1.x's multiple-optimizer API; "
            "set self.automatic_optimization = False and step self.optimizers() yourself."
        )
    if not is_overridden("validation_step", module):
        out.append(
            f"{name} has no validation_step(): a Determined trial always validates. Define "
            "validation_step() and val_dataloader() (on the module or the data module)."
        )
    has_val = is_overridden("val_dataloader", module) or (
        datamodule is not None and is_overridden("val_dataloader", datamodule)
    )
    if not has_val:
        out.append(
            f"{name} has no val_dataloader(): a Determined trial always validates. Define it "
            "on the module or pass a LightningDataModule that defines it."
        )
    if is_overridden("configure_callbacks", module) and module.configure_callbacks():
        out.append(
            f"{name}.configure_callbacks() returned Lightning callbacks; a trial has no "
            "lightning.Trainer to run them. Move their logic into the module's hooks, or "
            "write a PyTorchCallback."
        )
    if _aggregation_frequency(context) > 1:
        out.append(
            "LightningAdapter does not support optimizations.aggregation_frequency > 1: the "
            "module's own optimizer_zero_grad / optimizer_step hooks decide when gradients are "
            "cleared. Set aggregation_frequency to 1."
        )
    return out
