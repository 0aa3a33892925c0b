"""`init()` and `Trainer`: the Trainer API entry points, running on a `lightning.Trainer`.

`init()` builds the trial context (hyperparameters, config, distributed info, engine settings);
`Trainer(trial, context).fit(...)` checks the arguments, wraps the trial in a `TrialModule`,
adds the `TrialBoundaries` callback for Determined's schedule and runs Lightning's fit loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from . import _cluster_info
from ._boundaries import TrialBoundaries
from ._checkpoint import read_checkpoint, resolve_checkpoint
from ._context import PyTorchTrialContext
from ._distributed import DistributedContext
from ._errors import BridgeError, InvalidArgumentError, InvalidTrialError
from ._module import TrialModule
from ._retention import CheckpointRetention
from ._units import Batch, TrainUnit, check_length, check_period

logger = logging.getLogger("lightning_bridge")

CHECKPOINT_POLICIES = ("best", "all", "none")

# Lightning warnings about choices the bridge makes on the user's behalf (the trial fetches its
# own batches; metrics are reported at Determined's boundaries, not Lightning's logging
# interval). They say nothing actionable to a trial's author, so fits run without them.
_ENGINE_WARNINGS = (
    r".*`dataloader_iter` step flavor.*",
    r".*Found `dataloader_iter` argument.*",
    r".*smaller than the logging interval.*",
    r".*It is recommended to use `self.log\(.*sync_dist=True.*",
    # Lightning 2.6 on recent torch: its own use of a deprecated torch pytree API.
    r".*isinstance\(treespec, LeafSpec\).*",
)


class _Engine:
    """The Lightning-facing settings given to `init()`, used to build the `lightning.Trainer`."""

    def __init__(
        self,
        accelerator: str,
        devices: Any,
        num_nodes: int,
        strategy: Any,
        precision: Any,
        checkpoint_dir: str | os.PathLike[str] | None,
        trainer_kwargs: dict[str, Any],
    ) -> None:
        self.accelerator = accelerator
        self.devices = devices
        self.num_nodes = num_nodes
        self.strategy = strategy
        self.precision = precision
        self.checkpoint_dir = checkpoint_dir
        self.trainer_kwargs = trainer_kwargs


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
) -> Iterator[PyTorchTrialContext]:
    """Build the `PyTorchTrialContext` a trial is constructed with; use it as a context manager.

    The first five arguments are Determined's. The rest configure the Lightning engine:
    `accelerator`, `devices`, `num_nodes`, `strategy` and `precision` go to `lightning.Trainer`,
    as does anything in `trainer_kwargs`; `checkpoint_dir` is where checkpoints are written
    (default: `checkpoint_storage` from `exp_conf`, else `./checkpoints`); `run_dir` holds
    TensorBoard / CSV logs (default: the working directory).
    """
    # Run by `lightning-bridge run`: the runner's config and settings fill the defaults.
    given = _cluster_info.init_defaults(
        {
            "hparams": hparams,
            "exp_conf": exp_conf,
            "aggregation_frequency": aggregation_frequency,
            "accelerator": accelerator,
            "devices": devices,
            "strategy": strategy,
            "precision": precision,
        }
    )
    hparams, exp_conf = given["hparams"], given["exp_conf"]
    aggregation_frequency, accelerator = given["aggregation_frequency"], given["accelerator"]
    devices, strategy, precision = given["devices"], given["strategy"], given["precision"]
    dist = distributed if distributed is not None else DistributedContext()
    devices, num_nodes, strategy = _launch_settings(distributed, devices, num_nodes, strategy)
    seed = None
    if exp_conf is not None:
        seed = (exp_conf.get("reproducibility") or {}).get("experiment_seed")
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
        slots=_slots(dist, devices, num_nodes),
    )
    context._engine = _Engine(  # type: ignore[attr-defined]
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        precision=precision,
        checkpoint_dir=checkpoint_dir,
        trainer_kwargs=dict(trainer_kwargs or {}),
    )
    owned_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    try:
        yield context
    finally:
        if context._tb_writer is not None:
            context._tb_writer.close()
        # A process group Lightning created for this run is torn down here: left to the
        # interpreter's exit, its communication threads can abort the process.
        if (
            owned_group
            and distributed is None
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
        ):
            torch.distributed.destroy_process_group()


def _checkpoint_dir(context: PyTorchTrialContext, explicit: Any) -> pathlib.Path:
    if explicit is not None:
        return pathlib.Path(explicit)
    storage = (context._exp_conf or {}).get("checkpoint_storage") or {}
    if isinstance(storage, dict) and storage.get("host_path"):
        return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")
    return context._run_dir / "checkpoints"


def _loggers(context: PyTorchTrialContext) -> list[Any]:
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    try:
        import tensorboard  # noqa: F401
    except ImportError:
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


def _lightning_settings(
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


class Trainer:
    """Trains a `PyTorchTrial` with Determined's schedule on a `lightning.Trainer`."""

    def __init__(self, trial: Any, context: PyTorchTrialContext) -> None:
        if not isinstance(context, PyTorchTrialContext):
            raise InvalidArgumentError(
                "Trainer(trial, context) needs the context from lightning_bridge.init(); got "
                f"{type(context).__name__}."
            )
        self._trial = trial
        self._context = context
        self.lightning_trainer: pl.Trainer | None = None
        self.checkpoints: list[pathlib.Path] = []
        # The metrics of the last validation of the latest fit (None before one ran).
        self.last_validation_metrics: dict[str, Any] | None = None

    def configure_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Deprecated in Determined; use `fit(profiling_enabled=True)` or `set_profiler`."""
        logger.warning("configure_profiler() is deprecated: use fit(profiling_enabled=True).")

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit = Batch(100),
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
    ) -> None:
        """Train until `max_length`, validating, checkpointing and reporting at their periods."""
        max_length, test_mode = _cluster_info.fit_defaults(max_length, test_mode)
        try:
            self._fit(
                checkpoint_period=checkpoint_period,
                validation_period=validation_period,
                max_length=max_length,
                reporting_period=reporting_period,
                checkpoint_policy=checkpoint_policy,
                latest_checkpoint=latest_checkpoint,
                step_zero_validation=step_zero_validation,
                test_mode=test_mode,
                profiling_enabled=profiling_enabled,
            )
        except BridgeError as exc:
            raise exc.with_traceback(None) from None

    def _fit(
        self,
        *,
        checkpoint_period: TrainUnit | None,
        validation_period: TrainUnit | None,
        max_length: TrainUnit | None,
        reporting_period: TrainUnit,
        checkpoint_policy: str,
        latest_checkpoint: str | None,
        step_zero_validation: bool,
        test_mode: bool,
        profiling_enabled: bool,
    ) -> None:
        ctx = self._context
        length = check_length(max_length)
        validation = check_period("validation_period", validation_period or Batch(sys.maxsize))
        checkpoint = check_period("checkpoint_period", checkpoint_period or Batch(sys.maxsize))
        reporting = check_period("reporting_period", reporting_period)
        if checkpoint_policy not in CHECKPOINT_POLICIES:
            raise InvalidArgumentError(
                f"checkpoint_policy must be one of {', '.join(CHECKPOINT_POLICIES)}; got "
                f"{checkpoint_policy!r}."
            )
        searcher = (ctx._exp_conf or {}).get("searcher") or {}
        metric = searcher.get("metric")
        if checkpoint_policy == "best" and not metric:
            logger.warning(
                "checkpoint_policy='best' needs searcher.metric in the experiment config to "
                "compare validations; checkpointing after every validation ('all') instead."
            )
            checkpoint_policy = "all"
        for name, flag in (
            ("step_zero_validation", step_zero_validation),
            ("test_mode", test_mode),
            ("profiling_enabled", profiling_enabled),
        ):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False; got {flag!r}.")
        if not hasattr(self._trial, "train_batch"):
            raise InvalidTrialError(
                f"{type(self._trial).__name__} is not a PyTorchTrial: it has no train_batch()."
            )

        engine: Any = getattr(ctx, "_engine", None)
        ckpt_dir = _checkpoint_dir(ctx, engine.checkpoint_dir if engine else None)
        if latest_checkpoint is not None:
            latest_checkpoint = str(resolve_checkpoint(latest_checkpoint, ckpt_dir))
        module = TrialModule(
            self._trial, ctx, test_mode=test_mode, latest_checkpoint=latest_checkpoint
        )
        if latest_checkpoint is not None:
            module.resume_from(*read_checkpoint(latest_checkpoint))
        boundaries = TrialBoundaries(
            max_length=length,
            validation_period=validation,
            checkpoint_period=checkpoint,
            reporting_period=reporting,
            checkpoint_policy=checkpoint_policy,
            checkpoint_dir=ckpt_dir,
            step_zero_validation=step_zero_validation,
            test_mode=test_mode,
            searcher_metric=metric,
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            retention=CheckpointRetention.from_config(ctx._exp_conf),
        )
        trainer = pl.Trainer(
            **_lightning_settings(
                ctx,
                boundaries,
                test_mode=test_mode,
                resuming=latest_checkpoint is not None,
                profiling_enabled=profiling_enabled,
            )
        )
        self.lightning_trainer = trainer
        try:
            with warnings.catch_warnings():
                for pattern in _ENGINE_WARNINGS:
                    warnings.filterwarnings("ignore", message=pattern)
                trainer.fit(module)
        finally:
            module.shutdown()
            self.checkpoints = list(boundaries.checkpoints)
            self.last_validation_metrics = module.last_validation_metrics
            _cluster_info.record_fit(module.last_validation_metrics, self.checkpoints)
        if boundaries.checkpoints:
            logger.info("Checkpoints are in %s", ckpt_dir)
        if boundaries.preempted_by is not None:
            where = boundaries.checkpoints[-1] if boundaries.checkpoints else ckpt_dir
            print(
                f"Stopped by {boundaries.preempted_by} after batch "
                f"{module.state.batches_trained}; checkpoint {where}. Continue with "
                f"fit(latest_checkpoint={str(where)!r}).",
                flush=True,
            )
            raise SystemExit(0)
