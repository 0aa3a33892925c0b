"""`init()`: the trial context for a Trainer-API run, with its engine settings.

Builds the `PyTorchTrialContext` from Determined's arguments (hyperparameters, config,
distributed info, gradient aggregation) and settles the context's `FitSetup`: the
`EngineSettings` the `Trainer` builds `lightning.Fabric` from, the checkpoint folder, and the
runner's `RunDescription` when `lightning-bridge run` started the process (its values fill
the arguments left at their defaults). Under torchrun each launched process trains one device.

Each fit's settings (`fit_settings`: its `lightning.Fabric` arguments and its loop's options)
are built from the context's `EngineSettings`, adjusted for the trial as it was built: DDP
that finds unused parameters for several models, float16 mixed precision for automatic AMP;
with the progress bar, the model summary, the loggers (TensorBoard when installed, else CSV,
by default) and Lightning's profiler. `checkpoint_dir` says where its checkpoints go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from lightning_bridge import _logging
from lightning_bridge._errors import InvalidArgumentError, is_invalid_hp
from lightning_bridge.checkpoint._bounded import check_expanded_size
from lightning_bridge.checkpoint._code import snapshot as snapshot_code
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._context import (
    PyTorchTrialContext,
    config_values,
    context_setup,
    profiler_options,
)
from lightning_bridge.contract._determined_compat import is_determined_object
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._trial_context import close_tensorboard_writer
from lightning_bridge.translation._engine_settings import EngineSettings
from lightning_bridge.translation.fit._launch import launch_processes
from lightning_bridge.translation.services._logger_reports import run_loggers
from lightning_bridge.translation.services._run_description import RunDescription


@dataclasses.dataclass(frozen=True)
class FitSetup:
    """What `init()` settled for the fits of its context: the engine settings, the checkpoint
    folder it was given, and the runner's description of the trial (None outside a run)."""

    engine: EngineSettings = EngineSettings()
    checkpoint_dir: str | os.PathLike[str] | None = None
    run: RunDescription | None = None


# Each context `init()` built, with its setup (the Trainer asks `setup_of`).
_SETUPS: weakref.WeakKeyDictionary[PyTorchTrialContext, FitSetup] = weakref.WeakKeyDictionary()


def setup_of(context: PyTorchTrialContext) -> FitSetup:
    """The setup `init()` gave `context` (the defaults for a context built otherwise)."""
    return _SETUPS.get(context) or FitSetup()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.random.manual_seed(seed)


def _device(accelerator: str, distributed: DistributedContext) -> torch.device:
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", distributed.local_rank)
    return torch.device("cpu")


def _launch_settings(
    distributed: DistributedContext | None, devices: Any, num_nodes: int, strategy: Any
) -> tuple[Any, int, Any]:
    """Under torchrun (or an existing process group) run one device per launched process."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if distributed is not None:
        world = max(world, distributed.size)
    if devices is None and world > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
        devices, num_nodes = local, max(1, world // local)
        if strategy == "auto":
            strategy = "ddp"
    return devices, num_nodes, strategy


def _slots(distributed: DistributedContext, devices: Any, num_nodes: int) -> int:
    """How many processes will train: the launcher's world, or devices x nodes for Lightning's."""
    if distributed.size > 1:
        return distributed.size
    if isinstance(devices, int) and devices > 0:
        return devices * max(num_nodes, 1)
    if isinstance(devices, (list, tuple)):
        return len(devices) * max(num_nodes, 1)
    return 1


@contextlib.contextmanager
def init(
    *,
    hparams: dict[str, Any] | None = None,
    exp_conf: dict[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
    accelerator: str = "auto",
    devices: Any = None,
    num_nodes: int = 1,
    strategy: Any = "auto",
    precision: Any = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    trainer_kwargs: dict[str, Any] | None = None,
    code_dir: str | os.PathLike[str] | None = None,
) -> Iterator[PyTorchTrialContext]:
    """Build the `PyTorchTrialContext` a trial is constructed with; use it as a context manager.

    The first five arguments are Determined's. The rest configure the Lightning engine:
    `accelerator`, `devices`, `num_nodes`, `strategy` and `precision` build the fit's
    `lightning.Fabric`, `trainer_kwargs` the rest of its `EngineSettings`; `checkpoint_dir` is
    where checkpoints are written (default: `checkpoint_storage` from `exp_conf`, else
    `./checkpoints`); `run_dir` holds TensorBoard / CSV logs (default: the working directory);
    `code_dir` (`lightning-bridge run` sets it to the experiment folder; default: the working
    directory, as Determined's local mode copies it) is copied into every checkpoint's `code/`
    as it is now (`.detignore` honoured, never checkpoints or a workspace), so
    `load_trial_from_checkpoint_path(path)` finds the trial class on another machine.
    """
    # Run by `lightning-bridge run`: the runner's description fills the defaults.
    run = RunDescription.current()
    if run is not None:
        if hparams is None:
            hparams = dict(run.hparams)
        if exp_conf is None:
            exp_conf = dict(run.config)
        if aggregation_frequency == 1:
            aggregation_frequency = run.aggregation_frequency
        given = run.engine
        accelerator = given.accelerator if accelerator == "auto" else accelerator
        devices = given.devices if devices is None else devices
        num_nodes = given.num_nodes if num_nodes == 1 else num_nodes
        strategy = given.strategy if strategy == "auto" else strategy
        precision = given.precision if precision is None else precision
        run_dir = run.run_dir if run_dir is None else run_dir
        checkpoint_dir = run.checkpoint_dir if checkpoint_dir is None else checkpoint_dir
        code_dir = run.context_dir if code_dir is None else code_dir
        if run.log_file is not None:
            # A script run by `lightning-bridge run` logs like a trial class: one format, and
            # the trial's log file.
            _logging.configure(run.log_file)
    if distributed is not None and not (
        isinstance(distributed, DistributedContext)
        or is_determined_object(distributed, "DistributedContext")
    ):
        raise InvalidArgumentError(
            "init(distributed=...) takes a DistributedContext (e.g. "
            "DistributedContext.from_torch_distributed()) or None (the launcher's processes); "
            f"got {distributed!r}."
        )
    if exp_conf is not None:
        check_expanded_size(exp_conf, "init(exp_conf=...)")
    EngineSettings(
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision=precision,
    ).check()
    devices, num_nodes, strategy = _launch_settings(distributed, devices, num_nodes, strategy)
    engine = EngineSettings.from_trainer_kwargs(
        trainer_kwargs,
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision=precision,
    )
    owned_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    # Every process running and the process group created before the trial is built, as in
    # Determined: the trial's __init__ reads the true rank and size. A `distributed` context
    # given by the caller means its processes are the caller's to start.
    if distributed is None:
        launch_processes(engine)
    if code_dir is None and run is None:
        code_dir = os.getcwd()  # as Determined's local mode: the working directory is the code
    # The code is what the folder holds now: nothing the run writes later rides along.
    if code_dir is not None:
        snapshot_code(
            pathlib.Path(code_dir), exclude=[pathlib.Path(checkpoint_dir or "checkpoints")]
        )
    dist = distributed if distributed is not None else DistributedContext()
    values = ConfigValues.of(exp_conf)
    # Run by `lightning-bridge run`: every trial has its own seed, as on a cluster.
    seed = run.trial_seed if run is not None else values.experiment_seed
    if seed is not None:
        _seed_everything(int(seed))
    context = PyTorchTrialContext(
        hparams=hparams,
        exp_conf=exp_conf,
        distributed=dist,
        aggregation_frequency=aggregation_frequency,
        enable_tensorboard_logging=enable_tensorboard_logging,
        trial_seed=None if seed is None else int(seed),
        device=_device(accelerator, dist),
        run_dir=pathlib.Path(run_dir) if run_dir is not None else None,
        code_dir=pathlib.Path(code_dir) if code_dir is not None else None,
        slots=_slots(dist, devices, num_nodes),
        config_values=values,
    )
    _SETUPS[context] = FitSetup(engine, checkpoint_dir, run)
    try:
        yield context
    except BaseException as exc:
        # As Determined's: InvalidHP ends the trial (the search replaces it); exit 0.
        if is_invalid_hp(exc) and run is not None and _end_invalid_hp(run, exc):
            raise SystemExit(0) from None
        raise
    finally:
        close_tensorboard_writer(context)
        # A process group Lightning created for this run is torn down here: left to the
        # interpreter's exit, its communication threads can abort the process.
        if (
            owned_group
            and distributed is None
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            torch.distributed.destroy_process_group()


def _end_invalid_hp(run: RunDescription, exc: BaseException) -> bool:
    """`end_invalid_hp`, imported only when a trial raises InvalidHP: the search and record
    modules (SQLAlchemy, pydantic) stay out of runs that do not need them."""
    from lightning_bridge.translation.services._search_report import end_invalid_hp

    return end_invalid_hp(run, exc)


def checkpoint_dir(context: PyTorchTrialContext, explicit: Any) -> pathlib.Path:
    if explicit is not None:
        return pathlib.Path(explicit)
    host_dir = config_values(context).checkpoint_host_dir
    return host_dir if host_dir is not None else context_setup(context).run_dir / "checkpoints"


def _loggers(context: PyTorchTrialContext) -> list[Any]:
    return run_loggers(context_setup(context).run_dir, context.get_tensorboard_path())


def _strategy(ctx: PyTorchTrialContext, strategy: Any) -> Any:
    """The strategy for a fit: DDP over several wrapped models looks for unused parameters.

    Determined wraps each model in its own DistributedDataParallel; the bridge wraps the
    trial's models under one root module, so a trial that steps its models separately (a GAN:
    the discriminator's loss leaves the generator's parameters without gradients) would stop
    DDP with "parameters that were not used". With several models, DDP is told to find them,
    so every backward all-reduces the gradients it produced, as the per-model wrappers did.
    """
    processes = context_setup(ctx).processes
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
    options = profiler_options(ctx)
    if options is not None:
        from lightning.pytorch.profilers import PyTorchProfiler

        value = PyTorchProfiler(dirpath=str(ctx.get_tensorboard_path()), **options)
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
        value.setup(
            stage="fit",
            local_rank=ctx.distributed.local_rank,
            log_dir=str(context_setup(ctx).run_dir),
        )
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
