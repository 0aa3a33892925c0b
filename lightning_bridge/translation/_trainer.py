"""`Trainer`: the Trainer API's fit, running the trial's loop on `lightning.Fabric`.

`Trainer(trial, context).fit(...)` (the context from `init()`) checks the arguments, builds
the trial's `TrialCore`, `TrialBoundaries` for Determined's schedule and a `lightning.Fabric`
(launching the processes of a multi-device run), and runs `FitLoop`. A trial that should run
under a `lightning.Trainer` instead is handed to one as a `TrialModule`.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import warnings
from typing import Any

import lightning as L

from lightning_bridge._errors import BridgeError, InvalidArgumentError, InvalidTrialError
from lightning_bridge.checkpoint._async import CheckpointWriter
from lightning_bridge.checkpoint._layout import resolve_checkpoint
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.contract import _cluster_info
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._units import Batch, TrainUnit, check_length, check_period
from lightning_bridge.translation._boundaries import TrialBoundaries
from lightning_bridge.translation._core import TrialCore
from lightning_bridge.translation._fabric_engine import FabricEngine
from lightning_bridge.translation._fit_loop import FitLoop, model_summary
from lightning_bridge.translation._settings import checkpoint_dir, fit_settings

logger = logging.getLogger("lightning_bridge")

CHECKPOINT_POLICIES = ("best", "all", "none")

# Lightning warnings about choices the bridge makes on the user's behalf. They say nothing
# actionable to a trial's author, so fits run without them.
_ENGINE_WARNINGS = (
    # Lightning 2.6 on recent torch: its own use of a deprecated torch pytree API.
    r".*isinstance\(treespec, LeafSpec\).*",
)


class Trainer:
    """Trains a `PyTorchTrial` with Determined's schedule, its loop on `lightning.Fabric`."""

    def __init__(self, trial: Any, context: PyTorchTrialContext) -> None:
        if not isinstance(context, PyTorchTrialContext):
            raise InvalidArgumentError(
                "Trainer(trial, context) needs the context from lightning_bridge.init(); got "
                f"{type(context).__name__}."
            )
        self._trial = trial
        self._context = context
        # The `lightning.Fabric` of the latest fit (its strategy and precision plugin).
        self.fabric: L.Fabric | None = None
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
        ckpt_dir = checkpoint_dir(ctx, engine.checkpoint_dir if engine else None)
        if latest_checkpoint is not None:
            latest_checkpoint = str(resolve_checkpoint(latest_checkpoint, ckpt_dir))
        core = TrialCore(self._trial, ctx, test_mode=test_mode, latest_checkpoint=latest_checkpoint)
        if latest_checkpoint is not None:
            core.resume_from(*read_checkpoint(latest_checkpoint))
        writer = CheckpointWriter()
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
            writer=writer,
        )
        settings = fit_settings(ctx, test_mode=test_mode, profiling_enabled=profiling_enabled)
        fabric = L.Fabric(**settings.fabric)
        _check_launcher(fabric)
        self.fabric = fabric
        status = "failed"
        try:
            with warnings.catch_warnings():
                for pattern in _ENGINE_WARNINGS:
                    warnings.filterwarnings("ignore", message=pattern)
                fabric.launch()
                fit_engine = FabricEngine(fabric, ctx, settings.loggers)
                core.attach(fit_engine)
                if settings.model_summary and core.is_chief:
                    print(model_summary(ctx.models), flush=True)
                loop = FitLoop(
                    core,
                    fit_engine,
                    boundaries,
                    writer=writer,
                    progress_bar=settings.progress_bar,
                    profiler=settings.profiler,
                    length=Batch(1) if test_mode else length,
                )
                loop.run()
            status = "success"
        finally:
            core.shutdown()
            _close(settings, status)
            self.checkpoints = list(boundaries.checkpoints)
            self.last_validation_metrics = core.last_validation_metrics
            _cluster_info.record_fit(core.last_validation_metrics, self.checkpoints)
        if boundaries.checkpoints:
            logger.info("Checkpoints are in %s", ckpt_dir)
        if boundaries.preempted_by is not None:
            where = boundaries.checkpoints[-1] if boundaries.checkpoints else ckpt_dir
            print(
                f"Stopped by {boundaries.preempted_by} after batch "
                f"{core.state.batches_trained}; checkpoint {where}. Continue with "
                f"fit(latest_checkpoint={str(where)!r}).",
                flush=True,
            )
            raise SystemExit(0)


def _check_launcher(fabric: L.Fabric) -> None:
    """Processes started by multiprocessing (`ddp_spawn`, `ddp_fork`, `ddp_notebook`) would
    each train a copy of the trial, leaving the caller's untrained: refuse them."""
    launcher = getattr(fabric.strategy, "launcher", None)
    if launcher is not None and type(launcher).__name__ == "_MultiProcessingLauncher":
        raise InvalidArgumentError(
            f"strategy {type(fabric.strategy).__name__} with start method "
            f"{getattr(launcher, '_start_method', '?')!r} starts processes that would each train "
            "a copy of the trial; use strategy='ddp' (each process runs the script, as "
            "Determined's launcher does) or launch the script with torchrun."
        )


def _close(settings: Any, status: str) -> None:
    """Flush and close the fit's loggers, and write the profiler's report."""
    for fit_logger in settings.loggers:
        fit_logger.finalize(status)
    if settings.profiler is not None:
        settings.profiler.describe()
