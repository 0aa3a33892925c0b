"""The settings of one fit (its `lightning.Fabric` and its loop), and where its files go.

`init()`'s `EngineSettings` build the fit's `lightning.Fabric`, adjusted for the trial as it
was built: DDP that finds unused parameters for several models, float16 mixed precision for
automatic AMP. They also carry the loop's options: the progress bar, the model summary, the
loggers (TensorBoard when installed, else CSV, by default) and Lightning's profiler.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.contract._context import PyTorchTrialContext, config_values
from lightning_bridge.translation._engine_settings import EngineSettings


def checkpoint_dir(context: PyTorchTrialContext, explicit: Any) -> pathlib.Path:
    if explicit is not None:
        return pathlib.Path(explicit)
    host_dir = config_values(context).checkpoint_host_dir
    return host_dir if host_dir is not None else context._run_dir / "checkpoints"


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

    Determined wraps each model in its own DistributedDataParallel; the bridge wraps the
    trial's models under one root module, so a trial that steps its models separately (a GAN:
    the discriminator's loss leaves the generator's parameters without gradients) would stop
    DDP with "parameters that were not used". With several models, DDP is told to find them,
    so every backward all-reduces the gradients it produced, as the per-model wrappers did.
    """
    processes = max(ctx._slots or ctx.distributed.size, 1)
    if len(ctx.models) > 1 and processes > 1 and strategy in ("auto", "ddp"):
        from lightning.fabric.strategies import DDPStrategy

        return DDPStrategy(find_unused_parameters=True)
    return strategy


@dataclasses.dataclass
class FitSettings:
    """How a fit runs: the `lightning.Fabric` arguments and the loop's options."""

    fabric: dict[str, Any]
    loggers: list[Any]
    progress_bar: bool
    model_summary: bool
    profiler: Any


def _logger_setting(ctx: PyTorchTrialContext, value: Any) -> list[Any]:
    if value is None or value is True:
        return _loggers(ctx)
    if value is False:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _profiler(ctx: PyTorchTrialContext, value: Any, profiling_enabled: bool) -> Any:
    """Lightning's profiler for the fit: `set_profiler`'s PyTorch profiler, a profiler given in
    `trainer_kwargs`, or the simple one for `profiling_enabled`."""
    if ctx._profiler_kwargs is not None:
        from lightning.pytorch.profilers import PyTorchProfiler

        value = PyTorchProfiler(dirpath=str(ctx.get_tensorboard_path()), **ctx._profiler_kwargs)
    elif value is None and profiling_enabled:
        value = "simple"
    if isinstance(value, str):
        from lightning.pytorch.profilers import (
            AdvancedProfiler,
            PassThroughProfiler,
            PyTorchProfiler,
            SimpleProfiler,
        )

        names = {
            "simple": SimpleProfiler,
            "advanced": AdvancedProfiler,
            "pytorch": PyTorchProfiler,
            "passthrough": PassThroughProfiler,
        }
        if value not in names:
            raise InvalidArgumentError(
                f"profiler={value!r} is not one of Lightning's profilers: {', '.join(names)}."
            )
        value = names[value]()
    if value is not None:
        value.setup(stage="fit", local_rank=ctx.distributed.local_rank, log_dir=str(ctx._run_dir))
    return value


def fit_settings(
    ctx: PyTorchTrialContext,
    engine: EngineSettings,
    *,
    test_mode: bool,
    profiling_enabled: bool,
) -> FitSettings:
    """The settings of a fit: `init()`'s engine settings (float16 mixed precision for a trial
    that asked for automatic AMP, DDP finding unused parameters for several models), the
    loggers (TensorBoard when installed, else CSV), the progress bar, the model summary and
    the profiler."""
    if engine.precision is None and ctx.experimental._auto_amp:
        engine = engine.replace(precision="16-mixed")
    engine = engine.replace(strategy=_strategy(ctx, engine.strategy))
    loggers: list[Any] = []
    if ctx.get_enable_tensorboard_logging():
        loggers = _logger_setting(ctx, engine.logger)
    return FitSettings(
        fabric=engine.fabric_kwargs(),
        loggers=loggers,
        progress_bar=engine.progress_bar,
        model_summary=engine.model_summary,
        profiler=_profiler(ctx, engine.profiler, profiling_enabled),
    )
