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
from typing import TYPE_CHECKING, Any

import lightning as L

from lightning_bridge import _logging
from lightning_bridge._errors import BridgeError, InvalidArgumentError, TrialTypeError
from lightning_bridge.checkpoint._async import CheckpointWriter
from lightning_bridge.checkpoint._layout import resolve_checkpoint
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.checkpoint._writable import check_writable
from lightning_bridge.contract import _cluster_info
from lightning_bridge.contract._context import PyTorchTrialContext
from lightning_bridge.contract._units import Batch, TrainUnit, check_length, check_period
from lightning_bridge.translation._boundaries import TrialBoundaries
from lightning_bridge.translation._core import TrialCore
from lightning_bridge.translation._fabric_engine import FabricEngine
from lightning_bridge.translation._fit_loop import FitLoop, model_summary
from lightning_bridge.translation._lightning_private import (
    is_multiprocessing_launcher,
    start_method,
)
from lightning_bridge.translation._resume import starts_new_run
from lightning_bridge.translation._settings import checkpoint_dir, fit_settings

if TYPE_CHECKING:  # loaded only under `lightning-bridge run` (see _runner_reports)
    from lightning_bridge.translation._run_record import RunRecord
    from lightning_bridge.translation._search_report import SearchReport

logger = logging.getLogger("lightning_bridge")

CHECKPOINT_POLICIES = ("best", "all", "none")
TRUST_HINT = "fit(..., trust_checkpoint=True) (lightning-bridge run --trust-checkpoint)"

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
        *,
        trust_checkpoint: bool = False,
        warm_start: bool | None = None,
    ) -> None:
        """Train until `max_length`, validating, checkpointing and reporting at their periods.

        `latest_checkpoint` continues a run where it stopped; a checkpoint written by another
        trial (its trial id differs: a Determined cluster's checkpoint) starts a new run from
        its weights, optimizer and RNG state with the batch count at 0, as Determined does.
        `warm_start=True` / `False` chooses that explicitly. `trust_checkpoint=True` unpickles
        objects outside the weights-only safe set: only for files you trust (it can run code).
        """
        max_length, test_mode = _cluster_info.fit_defaults(max_length, test_mode)
        trust_checkpoint, warm_start = _cluster_info.resume_defaults(trust_checkpoint, warm_start)
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
                trust_checkpoint=trust_checkpoint,
                warm_start=warm_start,
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
        trust_checkpoint: bool,
        warm_start: bool | None,
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
            ("trust_checkpoint", trust_checkpoint),
        ):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False; got {flag!r}.")
        if not hasattr(self._trial, "train_batch"):
            raise TrialTypeError(
                f"{type(self._trial).__name__} is not a PyTorchTrial: it has no train_batch()."
            )

        engine: Any = getattr(ctx, "_engine", None)
        ckpt_dir = checkpoint_dir(ctx, engine.checkpoint_dir if engine else None)
        check_writable(ckpt_dir)
        if latest_checkpoint is not None:
            latest_checkpoint = str(resolve_checkpoint(latest_checkpoint, ckpt_dir))
        core = TrialCore(self._trial, ctx, test_mode=test_mode, latest_checkpoint=latest_checkpoint)
        payload: dict[str, Any] = {}
        warm = False
        if latest_checkpoint is not None:
            payload, state = read_checkpoint(
                latest_checkpoint, trusted=trust_checkpoint, trust_hint=TRUST_HINT
            )
            warm = starts_new_run(state, ctx.get_trial_id(), warm_start, latest_checkpoint)
            core.resume_from(payload, state, warm_start=warm)
        record, search = _runner_reports(ctx, ckpt_dir, test_mode)
        retention = (
            record.retention()
            if record is not None and core.is_chief
            else CheckpointRetention.from_config(ctx._exp_conf)
        )
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
            retention=retention,
            record=record,
            search=search,
            writer=writer,
        )
        if latest_checkpoint is not None and record is None and not warm:
            # A run continued outside the command: retention covers the checkpoints the run
            # it continues kept (the command's record knows them itself).
            boundaries.continue_retention(pathlib.Path(latest_checkpoint), payload)
        _logging.adopt_lightning()
        settings = fit_settings(ctx, test_mode=test_mode, profiling_enabled=profiling_enabled)
        fabric = L.Fabric(**settings.fabric)
        _check_launcher(fabric)
        self.fabric = fabric
        status = "failed"
        boundaries.stop.install()
        try:
            with warnings.catch_warnings():
                for pattern in _ENGINE_WARNINGS:
                    warnings.filterwarnings("ignore", message=pattern)
                fabric.launch()
                if core.is_chief:
                    _log_engine(fabric)
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
            if boundaries.search_stopped:
                # The searcher stopped it at the rung its signal came at: it is done.
                boundaries.preempted_by = None
            if record is not None and core.is_chief:
                record.ended(boundaries.preempted_by)
            if search is not None and core.is_chief:
                search.ended(boundaries.preempted_by is not None, boundaries.stopped_early)
        except BaseException as exc:
            if search is not None and core.is_chief:
                search.failed(exc)
            raise
        finally:
            boundaries.stop.restore()
            core.shutdown()
            _close(settings, status)
            self.checkpoints = list(boundaries.checkpoints)
            self.last_validation_metrics = core.last_validation_metrics
            if record is not None:
                record.close()
            if search is not None:
                search.close()
        if record is None and boundaries.checkpoints:
            logger.info("Checkpoints are in %s", ckpt_dir)
        if boundaries.preempted_by is not None:
            where: Any = boundaries.checkpoints[-1] if boundaries.checkpoints else ckpt_dir
            how = f"Continue with fit(latest_checkpoint={str(where)!r})."
            if record is not None and record.continue_command:
                # Under the command: its own continue command, the checkpoint where it is kept.
                if boundaries.checkpoints:
                    where = record.storage.url(boundaries.checkpoints[-1].name)
                how = f"Continue with: {record.continue_command}"
            if core.is_chief:
                print(
                    f"Stopped by {boundaries.preempted_by} after batch "
                    f"{core.state.batches_trained}; checkpoint {where}. {how}",
                    flush=True,
                )
            raise SystemExit(0)


def _log_engine(fabric: L.Fabric) -> None:
    """One line on the engine, in place of the device lines `lightning.Trainer` logs."""
    import torch

    processes = fabric.world_size
    logger.info(
        "GPU available: %s, used: %s (lightning.Fabric, %s, %s, %d process%s)",
        torch.cuda.is_available(),
        fabric.device.type == "cuda",
        type(fabric.strategy).__name__,
        type(fabric.strategy.precision).__name__,
        processes,
        "" if processes == 1 else "es",
    )


def _runner_reports(
    ctx: PyTorchTrialContext, ckpt_dir: pathlib.Path, test_mode: bool
) -> tuple[RunRecord | None, SearchReport | None]:
    """The run's record and its search report when `lightning-bridge run` started the fit
    (None, None otherwise: their modules, with SQLAlchemy and pydantic, are not even loaded)."""
    if _cluster_info.runner_run() is None:
        return None, None
    from lightning_bridge.translation._run_record import RunRecord
    from lightning_bridge.translation._search_report import SearchReport

    record = RunRecord.from_runner(ctx._exp_conf, ckpt_dir)
    return record, None if test_mode else SearchReport.from_runner()


def _check_launcher(fabric: L.Fabric) -> None:
    """Processes started by multiprocessing (`ddp_spawn`, `ddp_fork`, `ddp_notebook`) would
    each train a copy of the trial, leaving the caller's untrained: refuse them."""
    launcher = getattr(fabric.strategy, "launcher", None)
    if launcher is not None and is_multiprocessing_launcher(launcher):
        raise InvalidArgumentError(
            f"strategy {type(fabric.strategy).__name__} with start method "
            f"{start_method(launcher)!r} starts processes that would each train "
            "a copy of the trial; use strategy='ddp' (each process runs the script, as "
            "Determined's launcher does) or launch the script with torchrun."
        )


def _close(settings: Any, status: str) -> None:
    """Flush and close the fit's loggers, and write the profiler's report."""
    for fit_logger in settings.loggers:
        fit_logger.finalize(status)
    if settings.profiler is not None:
        settings.profiler.describe()
