"""What `LightningAdapter` refuses, checked when the trial is built (and by the port tool).

Each refusal names the hook, setting or callback and says what to do instead.
docs/lightning.md has the full table of LightningModule / LightningDataModule hooks, Trainer
arguments and callbacks, and their status.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning_bridge.adapter._lightning_callbacks import callback_problems
from lightning_bridge.adapter._lightning_packages import overrides
from lightning_bridge.adapter._trainer_arguments import TrainerSettings
from lightning_bridge.contract._config_values import ConfigValues


def has_validation(module: Any, datamodule: Any) -> bool:
    """Whether Lightning would validate: a `validation_step` and a validation loader."""
    loader = overrides(module, "val_dataloader", "LightningModule") or overrides(
        datamodule, "val_dataloader", "LightningDataModule"
    )
    return overrides(module, "validation_step", "LightningModule") and loader


def signature_refusals(module: Any) -> list[str]:
    """What the module's `training_step` signature alone rules out (class or instance)."""
    name = module.__name__ if isinstance(module, type) else type(module).__name__
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
    return out


def refusals(
    module: Any,
    datamodule: Any,
    callbacks: list[Any],
    settings: TrainerSettings,
    config: ConfigValues,
) -> list[str]:
    """Messages for everything in the module, data module, settings and callbacks a trial
    cannot run (empty when it can run all of it)."""
    out = signature_refusals(module)
    if not module.automatic_optimization:
        # lightning.Trainer refuses both under manual optimization, with these messages.
        if settings.accumulate_grad_batches != 1:
            out.append(
                "Automatic gradient accumulation is not supported for manual optimization. "
                f"Remove accumulate_grad_batches={settings.accumulate_grad_batches} (hparams or "
                "optimizations.aggregation_frequency) or switch to automatic optimization."
            )
        if settings.gradient_clip_val is not None:
            out.append(
                "Automatic gradient clipping is not supported for manual optimization. Remove "
                "gradient_clip_val from the hparams or switch to automatic optimization "
                "(call self.clip_gradients() in training_step instead)."
            )
    out.extend(callback_problems(callbacks, module, config, settings.aggregation))
    return out
