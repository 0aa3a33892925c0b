"""`Trainer`: the Trainer API's fit, running the trial's loop on `lightning.Fabric`.

`Trainer(trial, context).fit(...)` (the context from `init()`) checks the arguments and builds
the fit's parts: the trial's `TrialCore`, the `Schedule` of its arguments, the loggers and a
`lightning.Fabric`; the services around the loop (the `Checkpointer`, under
`lightning-bridge run` the run record and a search's report) are built as for a
`DeepSpeedTrial` (`_fit_services`). It runs `FitLoop` (which launches the processes of a
multi-device run). A trial that should run under a
`lightning.Trainer` instead is handed to one as a `TrialModule`.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import lightning as L

from lightning_bridge import _logging
from lightning_bridge._errors import BridgeError, InvalidArgumentError, TrialTypeError
from lightning_bridge.checkpoint._layout import resolve_checkpoint
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.checkpoint._writable import check_writable
from lightning_bridge.contract._context import PyTorchTrialContext, config_values
from lightning_bridge.contract._units import Batch, TrainUnit
from lightning_bridge.translation.fit._core import TrialCore
from lightning_bridge.translation.fit._fabric_engine import FabricEngine
from lightning_bridge.translation.fit._fit_loop import FitLoop, model_summary
from lightning_bridge.translation.fit._fit_services import fit_services, settled_policy, stopped
from lightning_bridge.translation.fit._init import (
    FitSettings,
    checkpoint_dir,
    fit_settings,
    setup_of,
)
from lightning_bridge.translation.fit._launch import check_launcher
from lightning_bridge.translation.fit._metric_reports import LoggerReports
from lightning_bridge.translation.fit._resume import starts_new_run
from lightning_bridge.translation.fit._schedule import Schedule

logger = logging.getLogger("lightning_bridge")

TRUST_HINT = "fit(..., trust_checkpoint=True) (lightning-bridge run --trust-checkpoint)"


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
        run = setup_of(self._context).run  # the runner's values fill the defaults
        if run is not None:
            max_length, test_mode, trust_checkpoint, warm_start = run.fit_defaults(
                max_length, test_mode, trust_checkpoint, warm_start
            )
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
        schedule = Schedule.for_fit(
            max_length=max_length,
            validation_period=validation_period,
            checkpoint_period=checkpoint_period,
            reporting_period=reporting_period,
            test_mode=test_mode,
            step_zero_validation=step_zero_validation,
        )
        config = config_values(ctx)
        checkpoint_policy = settled_policy(checkpoint_policy, config)
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

        setup = setup_of(ctx)
        ckpt_dir = checkpoint_dir(ctx, setup.checkpoint_dir)
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
        _logging.adopt_lightning()
        settings = fit_settings(
            ctx, setup.engine, test_mode=test_mode, profiling_enabled=profiling_enabled
        )
        services = fit_services(
            setup.run,
            config,
            ckpt_dir,
            schedule=schedule,
            checkpoint_policy=checkpoint_policy,
            observers=core.observers,
            own_observers=[LoggerReports(settings.loggers, ctx.get_enable_tensorboard_logging)],
            is_chief=core.is_chief,
            test_mode=test_mode,
        )
        record, search, checkpointer = services.record, services.search, services.checkpointer
        if latest_checkpoint is not None and record is None and not warm:
            # A run continued outside the command: retention covers the checkpoints the run
            # it continues kept (the command's record knows them itself).
            checkpointer.continue_retention(pathlib.Path(latest_checkpoint), payload)
        fabric = L.Fabric(**settings.fabric)
        check_launcher(fabric)
        self.fabric = fabric
        loop = FitLoop(
            core,
            services.schedule,
            checkpointer,
            searcher_asks=(lambda: search.stopped) if search is not None else None,
            progress_bar=settings.progress_bar,
            profiler=settings.profiler,
        )
        try:
            outcome = loop.run(lambda: _start_engine(fabric, core, settings))
        finally:
            self.checkpoints = list(checkpointer.saved)
            self.last_validation_metrics = core.last_validation_metrics
        saved = checkpointer.saved
        if record is None and saved:
            logger.info("Checkpoints are in %s", ckpt_dir)
        if outcome.preempted_by is not None:
            stopped(
                outcome.preempted_by,
                services,
                ckpt_dir,
                core.state.batches_trained,
                core.is_chief,
            )


def _start_engine(fabric: L.Fabric, core: TrialCore, settings: FitSettings) -> FabricEngine:
    """Launch the fit's processes and set the trial's models and optimizers up on Fabric."""
    fabric.launch()
    if core.is_chief:
        _log_engine(fabric)
    engine = FabricEngine(fabric, core.context)
    core.attach(engine)
    if settings.model_summary and core.is_chief:
        print(model_summary(core.context.models), flush=True)
    return engine


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
