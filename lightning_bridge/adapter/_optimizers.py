"""`configure_optimizers` of a ported LightningModule, and its LR schedulers' moments.

The return value is parsed by Lightning's own helpers (every documented form: an optimizer, a
list, two lists, a dict, a list of dicts, `None`), so the scheduler configs (`interval`,
`frequency`, `monitor`, `strict`) are Lightning's. The schedulers are wrapped with
`StepMode.MANUAL_STEP` (checkpointed with the trial) and stepped by the adapter at Lightning's
moments: `"step"` after each optimizer step (frequency counting the batch within the epoch),
`"epoch"` at the epoch's last batch, `ReduceLROnPlateau` with its monitored value from
`callback_metrics` after the validation that ends the epoch (or the batch, for `"step"`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_packages import package_of, submodule
from lightning_bridge.translation._lightning_private import optimizer_helpers


def parse_optimizers(module: Any, conf: Any) -> tuple[list[torch.optim.Optimizer], list[Any]]:
    """Optimizers and `LRSchedulerConfig`s from `configure_optimizers()`'s return value."""
    if conf is None:
        return [], []
    package = package_of(module)
    helpers = optimizer_helpers(package)
    errors: tuple[type[BaseException], ...] = (MisconfigurationException,)
    errors += (submodule(package, "utilities.exceptions").MisconfigurationException,)
    try:
        optimizers, schedulers, monitor = helpers._configure_optimizers(conf)
        configs = (
            helpers._configure_schedulers_automatic_opt(schedulers, monitor)
            if module.automatic_optimization
            else helpers._configure_schedulers_manual_opt(schedulers)
        )
        helpers._validate_multiple_optimizers_support(optimizers, module)
        helpers._validate_optimizers_attached(optimizers, configs)
        helpers._validate_scheduler_api(configs, module)
    except (RuntimeError, TypeError, ValueError, KeyError, *errors) as exc:  # type: ignore[misc]
        raise InvalidTrialError(f"configure_optimizers(): {exc}") from None
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise InvalidTrialError(
                f"configure_optimizers() returned a {type(opt).__name__}; a trial steps "
                "torch.optim.Optimizer objects only."
            )
        if isinstance(opt, torch.optim.LBFGS):
            raise InvalidTrialError(
                "configure_optimizers() returned torch.optim.LBFGS, which re-evaluates the "
                "loss through a closure; a trial steps optimizers without one. Use an optimizer "
                "that steps once per batch (SGD, Adam, ...)."
            )
    return list(optimizers), list(configs)


def step_schedulers(
    module: Any,
    call: Any,
    configs: list[Any],
    callback_metrics: dict[str, Any],
    interval: str,
    plateau: bool,
    index: int,
) -> None:
    """Step the configs of `interval` (plateau or not) due at 0-based `index`, as Lightning."""
    if not module.automatic_optimization:
        return
    for config in configs:
        if plateau != bool(config.reduce_on_plateau) or config.interval != interval:
            continue
        if (index + 1) % config.frequency != 0:
            continue
        metric = None
        if config.reduce_on_plateau:
            metric = callback_metrics.get(config.monitor)
            if metric is None:
                message = (
                    f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not "
                    f"available. Available metrics are: {sorted(callback_metrics)}."
                )
                if config.strict:
                    raise InvalidTrialError(
                        message + " Log it with self.log(), or set 'strict': False in the "
                        "lr_scheduler config."
                    )
                warnings.warn(
                    message + " Skipping learning rate update.", RuntimeWarning, stacklevel=2
                )
                continue
        call("lr_scheduler_step", config.scheduler, metric)
