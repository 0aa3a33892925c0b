"""Lightning's private helpers the Lightning adapter reuses, imported in one place.

The adapter (`lightning_trial`, `LightningAdapter`) behaves exactly like `lightning.Trainer`
because it runs Lightning's own code for `self.log` (result collections and the per-hook
logging rules), `configure_optimizers` parsing, distributed samplers and collectives, rather
than a copy of it. Those helpers are private to Lightning. They are imported here, and only
here, so that a Lightning release that moves one fails with one message naming it; the rest of
the bridge does not import this module.
"""

from __future__ import annotations

import importlib
import types

import lightning.pytorch as pl

try:
    from lightning.fabric.utilities.data import _set_sampler_epoch
    from lightning.fabric.utilities.distributed import (
        _all_gather_ddp_if_available,
        _sync_ddp_if_available,
    )
    from lightning.pytorch.core.optimizer import (
        _configure_optimizers,
        _configure_schedulers_automatic_opt,
        _configure_schedulers_manual_opt,
        _validate_multiple_optimizers_support,
        _validate_optimizers_attached,
        _validate_scheduler_api,
    )
    from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
    from lightning.pytorch.trainer.connectors.logger_connector.fx_validator import _FxValidator
    from lightning.pytorch.trainer.connectors.logger_connector.result import (
        _get_default_dtype,
        _ResultCollection,
    )
    from lightning.pytorch.utilities.data import _update_dataloader
except ImportError as exc:  # pragma: no cover - depends on the installed Lightning
    raise ImportError(
        "lightning_bridge's Lightning adapter (lightning_trial, LightningAdapter) reuses a "
        f"Lightning helper that lightning {pl.__version__} does not have: {exc}. Install a "
        "Lightning release the adapter supports: pip install 'lightning>=2.4,<2.7'."
    ) from exc


def optimizer_helpers(package: types.ModuleType) -> types.ModuleType:
    """`core.optimizer` of the module's own Lightning package (`lightning.pytorch` or
    `pytorch_lightning`): its `configure_optimizers` checks look for that package's classes."""
    if package is pl:
        return importlib.import_module("lightning.pytorch.core.optimizer")
    return importlib.import_module(f"{package.__name__}.core.optimizer")


__all__ = [
    "_FxValidator",
    "_ResultCollection",
    "_all_gather_ddp_if_available",
    "_configure_optimizers",
    "_configure_schedulers_automatic_opt",
    "_configure_schedulers_manual_opt",
    "_get_default_dtype",
    "_get_distributed_sampler",
    "_set_sampler_epoch",
    "_sync_ddp_if_available",
    "_update_dataloader",
    "_validate_multiple_optimizers_support",
    "_validate_optimizers_attached",
    "_validate_scheduler_api",
    "optimizer_helpers",
]
