"""Every private Lightning name the bridge uses, imported or read here and nowhere else.

The bridge behaves like `lightning.Trainer` because it reuses Lightning's own code where a copy
would drift: the fit on Fabric reads Fabric's module wrapper and launcher and Lightning's
precision values; the Lightning adapter (`lightning_trial`, `LightningAdapter`) runs Lightning's
`self.log` result collections and per-hook rules, `configure_optimizers` parsing, distributed
samplers and collectives, and sets the attributes Lightning's own code reads on a module and a
trainer. All of that is private to Lightning. Keeping it in one module (the lowest layer that
may import Lightning) means a Lightning release that moves a name is found here, by
`tests/test_lightning_private.py`, which checks every name below against the installed
Lightning.

The adapter's helpers are loaded when this module is imported, but a missing one breaks only
the adapter: importing it from here then raises one `ImportError` naming the helper and the
Lightning releases to install, while the fit on Fabric keeps working.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from typing import Any, get_args

import lightning.pytorch as pl

# ----- the fit on Fabric ----------------------------------------------------------------------


def forward_module(fabric_module: Any) -> Any:
    """The strategy's wrapper (DDP, or the module itself) inside Fabric's `_FabricModule`;
    None when this Lightning wraps modules differently."""
    return getattr(fabric_module, "_forward_module", None)


def prepare_for_backward(ddp: Any, loss: Any) -> None:
    """Lightning's preparation of a DDP reducer before a backward outside DDP's forward."""
    from lightning.pytorch.overrides.distributed import prepare_for_backward as prepare

    prepare(ddp, loss)


def is_multiprocessing_launcher(launcher: Any) -> bool:
    """Whether Fabric starts the processes by multiprocessing (`ddp_spawn`, `ddp_fork`, ...)."""
    return type(launcher).__name__ == "_MultiProcessingLauncher"


def start_method(launcher: Any) -> str:
    """The multiprocessing start method of such a launcher ("?" when it has none)."""
    return str(getattr(launcher, "_start_method", "?"))


def precision_values() -> list[Any]:
    """Lightning's precision values: the names, their short aliases and the integers."""
    from lightning.fabric.plugins.precision import precision as module

    values: list[Any] = []
    for name in ("_PRECISION_INPUT_STR", "_PRECISION_INPUT_STR_ALIAS", "_PRECISION_INPUT_INT"):
        values.extend(get_args(getattr(module, name, None)) or ())
    return values


# ----- `TrialModule` under a user's lightning.Trainer ------------------------------------------


def trainer_logs_now(trainer: Any) -> bool:
    """Whether `lightning.Trainer` logs step values after the batch being trained, as for a
    module accumulating `accumulate_grad_batches` batches: its logger connector's
    `should_update_logs` (`log_every_n_steps` counted in batches that stepped), and not on a
    batch that only accumulates (`update_train_step_metrics` skips those)."""
    accumulating = trainer.fit_loop._should_accumulate()
    return bool(trainer._logger_connector.should_update_logs) and not accumulating


# ----- the Lightning adapter: attributes Lightning's own code reads and writes ----------------


def current_hook(module: Any) -> str | None:
    """The hook a LightningModule runs now (`_current_fx_name`, what `self.log` checks)."""
    return module._current_fx_name


def may_log(module: Any) -> bool:
    """Whether Lightning lets the hook a LightningModule runs now call `self.log` (its
    `_FxValidator` table: e.g. not in `on_validation_end` or `on_train_end`)."""
    from lightning.pytorch.trainer.connectors.logger_connector.fx_validator import _FxValidator

    hook = module._current_fx_name
    return hook is not None and _FxValidator.functions.get(hook) is not None


def set_current_hook(module: Any, hook: str | None) -> None:
    module._current_fx_name = hook


def forked_names(results: Any, metric: Any, on_step: bool) -> tuple[str, str]:
    """(name, forked name) Lightning gives a logged value in its result collection."""
    return results._forked_name(metric, on_step)


def step_value(metric: Any) -> Any:
    """The value a result-collection entry was last logged with in this step."""
    return metric._forward_cache


def set_lightning_optimizers(
    strategy: Any, optimizers: list[Any], package: types.ModuleType
) -> None:
    """Wrap `optimizers` in the package's `LightningOptimizer`, where the module's
    `optimizers()` reads them (`strategy._lightning_optimizers`)."""
    wrapper = importlib.import_module(f"{package.__name__}.core.optimizer").LightningOptimizer
    strategy._lightning_optimizers = [
        wrapper._to_lightning_optimizer(opt, strategy) for opt in optimizers
    ]


def lightning_optimizers(strategy: Any) -> list[Any]:
    """The `LightningOptimizer`s set by `set_lightning_optimizers`."""
    return list(strategy._lightning_optimizers)


class FitLoopView:
    """What Lightning's callbacks read of `trainer.fit_loop` / `trainer._logger_connector`:
    the optimizer steps taken (`epoch_loop._batches_that_stepped`, LearningRateMonitor's step)
    and whether step values are logged now (`should_update_logs`)."""

    def __init__(self, global_step: Callable[[], int], should_update: Callable[[], bool]) -> None:
        self._global_step = global_step
        self._should_update = should_update
        self.epoch_loop = self

    @property
    def _batches_that_stepped(self) -> int:
        return int(self._global_step())

    @property
    def should_update_logs(self) -> bool:
        return bool(self._should_update())


def attach_fit_loop(
    trainer: Any, global_step: Callable[[], int], should_update: Callable[[], bool]
) -> None:
    """Give a stand-in trainer the `fit_loop` and `_logger_connector` Lightning's callbacks read."""
    trainer.fit_loop = FitLoopView(global_step, should_update)
    trainer._logger_connector = trainer.fit_loop


def continue_fit_progress(
    trainer: Any, *, batches: int, epochs: int, epoch_len: int, steps: int
) -> None:
    """Load a `lightning.Trainer`'s loop counters as `Trainer.fit(ckpt_path=...)` would from a
    checkpoint saved after batch `batches` (`on_train_batch_end`, as `ModelCheckpoint(
    every_n_train_steps=...)` saves): `epochs` finished epochs of `epoch_len` batches,
    `steps` optimizer steps (manual optimization). Lightning's own restart then counts
    `max_steps`, `max_epochs`, `current_epoch`, the logging step and the batches left in the
    epoch from there. Called before the fit loop starts."""
    loop = trainer.fit_loop
    state = loop.state_dict()
    in_epoch = batches - epochs * epoch_len
    last_batch = in_epoch == 0
    if last_batch:  # saved after the last batch of the epoch before
        epochs, in_epoch = epochs - 1, epoch_len

    def progress(started: int, done: int, processed: int | None = None) -> dict[str, int]:
        return {
            "ready": started,
            "started": started,
            "processed": started if processed is None else processed,
            "completed": done,
        }

    state["epoch_progress"] = {
        "total": progress(epochs + 1, epochs, epochs),
        "current": progress(epochs + 1, epochs, epochs),
    }
    state["epoch_loop.batch_progress"] = {
        "total": progress(batches, batches - 1),
        "current": progress(in_epoch, in_epoch - 1),
        "is_last_batch": last_batch,
    }
    state["epoch_loop.manual_optimization.optim_step_progress"] = {
        "total": {"ready": steps, "completed": steps},
        "current": {"ready": steps, "completed": steps},
    }
    state["epoch_loop.state_dict"] = {
        **state.get("epoch_loop.state_dict", {}),
        "_batches_that_stepped": batches - 1,
    }
    loop.load_state_dict(state)


def optimizer_helpers(package: types.ModuleType) -> types.ModuleType:
    """`core.optimizer` of the module's own Lightning package (`lightning.pytorch` or
    `pytorch_lightning`), whose private `_configure_optimizers`, `_configure_schedulers_*` and
    `_validate_*` check for that package's classes."""
    if package is pl:
        return importlib.import_module("lightning.pytorch.core.optimizer")
    return importlib.import_module(f"{package.__name__}.core.optimizer")


# The private functions and classes of Lightning the adapter calls, by name.
ADAPTER_HELPERS = (
    "_FxValidator",
    "_ResultCollection",
    "_all_gather_ddp_if_available",
    "_get_default_dtype",
    "_get_distributed_sampler",
    "_set_sampler_epoch",
    "_sync_ddp_if_available",
    "_update_dataloader",
)
# ... and those `optimizer_helpers(package)` must have.
OPTIMIZER_HELPERS = (
    "_configure_optimizers",
    "_configure_schedulers_automatic_opt",
    "_configure_schedulers_manual_opt",
    "_validate_multiple_optimizers_support",
    "_validate_optimizers_attached",
    "_validate_scheduler_api",
)

_adapter_missing: ImportError | None = None
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
    _adapter_missing = ImportError(
        "lightning_bridge's Lightning adapter (lightning_trial, LightningAdapter) reuses a "
        f"Lightning helper that lightning {pl.__version__} does not have: {exc}. Install a "
        "Lightning release the adapter supports: pip install 'lightning>=2.4,<2.7'."
    )
    _adapter_missing.__cause__ = exc


def require_adapter_helpers() -> None:
    """Raise the one message naming a missing adapter helper (nothing when all are there)."""
    if _adapter_missing is not None:
        raise _adapter_missing


def __getattr__(name: str) -> Any:
    # Reached only for a name the import above could not bind: say which helper is missing.
    if name in ADAPTER_HELPERS + OPTIMIZER_HELPERS and _adapter_missing is not None:
        raise _adapter_missing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAPTER_HELPERS",
    "OPTIMIZER_HELPERS",
    "FitLoopView",
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
    "attach_fit_loop",
    "current_hook",
    "forked_names",
    "forward_module",
    "is_multiprocessing_launcher",
    "lightning_optimizers",
    "optimizer_helpers",
    "precision_values",
    "prepare_for_backward",
    "require_adapter_helpers",
    "set_current_hook",
    "set_lightning_optimizers",
    "start_method",
    "step_value",
]
