"""The `lightning.Trainer` arguments for a fit, and where its files go.

The bridge's fixed choices (Determined's schedule is driven by `TrialBoundaries`, so
Lightning's own validation, checkpointing and samplers are off), the loggers (TensorBoard
when installed, else CSV), the strategy (DDP that finds unused parameters for several
models) and the engine settings given to `init()`.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import TYPE_CHECKING, Any

from lightning_bridge.contract._context import PyTorchTrialContext

if TYPE_CHECKING:
    from lightning_bridge.translation._boundaries import TrialBoundaries


def checkpoint_dir(context: PyTorchTrialContext, explicit: Any) -> pathlib.Path:
    if explicit is not None:
        return pathlib.Path(explicit)
    storage = (context._exp_conf or {}).get("checkpoint_storage") or {}
    if isinstance(storage, dict) and storage.get("host_path"):
        return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")
    return context._run_dir / "checkpoints"


def tensorboard_installed() -> bool:
    """Whether the tensorboard package is installed. A folder named `tensorboard` on
    `sys.path` (old logs beside a script) imports as an empty namespace package and must not
    count: Lightning's TensorBoard logger would then fail."""
    try:
        spec = importlib.util.find_spec("tensorboard")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


def _loggers(context: PyTorchTrialContext) -> list[Any]:
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if not tensorboard_installed():
        return [CSVLogger(save_dir=str(context._run_dir), name="csv_logs", version="")]
    return [TensorBoardLogger(save_dir=str(context.get_tensorboard_path()), name="", version="")]


def _strategy(ctx: PyTorchTrialContext, strategy: Any) -> Any:
    """The strategy for a fit: DDP over several wrapped models looks for unused parameters.

    Determined wraps each model in its own DistributedDataParallel; Lightning wraps the whole
    `TrialModule`, so a trial that steps its models separately (a GAN: the discriminator's loss
    leaves the generator's parameters without gradients) would stop DDP with "parameters that
    were not used". With several models, DDP is told to find them, so every backward
    all-reduces the gradients it produced, as the per-model wrappers did.
    """
    processes = max(ctx._slots or ctx.distributed.size, 1)
    if len(ctx.models) > 1 and processes > 1 and strategy in ("auto", "ddp"):
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=True)
    return strategy


def lightning_settings(
    ctx: PyTorchTrialContext,
    boundaries: TrialBoundaries,
    *,
    test_mode: bool,
    resuming: bool,
    profiling_enabled: bool,
) -> dict[str, Any]:
    """The `lightning.Trainer` arguments for a fit: the bridge's fixed choices (Determined's
    schedule is driven by `boundaries`), then the engine settings given to `init()`."""
    engine: Any = getattr(ctx, "_engine", None)
    kwargs: dict[str, Any] = {
        "accelerator": engine.accelerator if engine else "auto",
        "devices": (engine.devices if engine and engine.devices is not None else 1),
        "num_nodes": engine.num_nodes if engine else 1,
        "strategy": _strategy(ctx, engine.strategy if engine else "auto"),
        "max_epochs": -1,
        "max_steps": -1,
        "num_sanity_val_steps": 0,
        "enable_checkpointing": False,
        "use_distributed_sampler": False,
        "inference_mode": False,
        "enable_model_summary": False,
        "logger": _loggers(ctx) if ctx.get_enable_tensorboard_logging() else False,
        "default_root_dir": str(ctx._run_dir),
        "callbacks": [boundaries],
    }
    if engine and engine.precision is not None:
        kwargs["precision"] = engine.precision
    elif ctx.experimental._auto_amp:
        kwargs["precision"] = "16-mixed"
    if test_mode:
        kwargs["limit_val_batches"] = 1
    if resuming:
        # A run continued mid-epoch first trains a short epoch; re-reading the training
        # data's length every epoch lets Lightning's epochs stay aligned with the trial's.
        kwargs["reload_dataloaders_every_n_epochs"] = 1
    if ctx._profiler_kwargs is not None:
        from lightning.pytorch.profilers import PyTorchProfiler

        kwargs["profiler"] = PyTorchProfiler(
            dirpath=str(ctx.get_tensorboard_path()), **ctx._profiler_kwargs
        )
    elif profiling_enabled:
        kwargs["profiler"] = "simple"
    if engine:
        extra = dict(engine.trainer_kwargs)
        callbacks = extra.pop("callbacks", [])
        kwargs["callbacks"] = [boundaries, *callbacks]
        kwargs.update(extra)
    return kwargs
