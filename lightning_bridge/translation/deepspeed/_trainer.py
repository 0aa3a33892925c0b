"""`deepspeed.Trainer` and `deepspeed.init()`: a `DeepSpeedTrial` trained by the fit's loop.

The trial built its engines with `deepspeed.initialize`; DeepSpeed does the engine work
(ZeRO, precision, gradient accumulation and clipping from its config, pipelines). Everything
else is the fit's, as for a `PyTorchTrial`: `FitLoop` with the `Schedule` of `fit()`'s
arguments, the `StopRequest` (signals, the trial's `set_stop_requested`, a searcher), the
`Checkpointer` (directory claim, policy, retention, `latest`; the checkpoint written by every
rank in Determined's DeepSpeedTrial layout) and the fit's observers (under
`lightning-bridge run`: the run record, a search's report, the MLflow mirror), built by the
same functions as `pytorch.Trainer`'s (`fit._fit_services`). The trial's side is
`DeepSpeedCore`; the engine the loop runs steps on is `DeepSpeedEngines`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import random
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from lightning_bridge import _logging
from lightning_bridge._errors import BridgeError, InvalidArgumentError, InvalidTrialError
from lightning_bridge.checkpoint._layout import resolve_checkpoint
from lightning_bridge.checkpoint._safe_load import read_trial_state
from lightning_bridge.checkpoint._writable import check_writable
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._deepspeed import DeepSpeedTrial, DeepSpeedTrialContext
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._trial_context import close_tensorboard_writer
from lightning_bridge.contract._units import Batch, TrainUnit
from lightning_bridge.translation._observer import FitObserver, Progress
from lightning_bridge.translation.deepspeed._core import DeepSpeedCore
from lightning_bridge.translation.deepspeed._cpu import prepare_cpu_accelerator
from lightning_bridge.translation.fit._fit_loop import FitLoop
from lightning_bridge.translation.fit._fit_services import fit_services, settled_policy, stopped
from lightning_bridge.translation.fit._resume import starts_new_run
from lightning_bridge.translation.fit._schedule import Schedule
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge")

EXTRA = "deepspeed"
_MISSING = (
    "DeepSpeedTrial needs DeepSpeed: pip install 'lightning-bridge[deepspeed]' "
    "(set DS_ACCELERATOR=cpu on a machine without a GPU)."
)
TRUST_HINT = "fit(..., trust_checkpoint=True) (lightning-bridge run --trust-checkpoint)"


def _deepspeed() -> Any:
    try:
        import deepspeed
    except ImportError:
        raise ImportError(_MISSING, name="deepspeed") from None
    return deepspeed


@dataclasses.dataclass(frozen=True)
class DeepSpeedSetup:
    """What `init()` settled for the fits of its context: the checkpoint folder, the run's
    folder and the runner's description (None outside `lightning-bridge run`)."""

    checkpoint_dir: pathlib.Path
    run: RunDescription | None = None


_SETUPS: weakref.WeakKeyDictionary[DeepSpeedTrialContext, DeepSpeedSetup] = (
    weakref.WeakKeyDictionary()
)


def _device(distributed: DistributedContext) -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", distributed.get_local_rank())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


@contextlib.contextmanager
def init(
    *,
    hparams: dict[str, Any] | None = None,
    exp_conf: dict[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> Iterator[DeepSpeedTrialContext]:
    """The context a `DeepSpeedTrial` is built with, in a DeepSpeed process group (gloo on
    the CPU, NCCL on GPUs; one process when not launched by torchrun). Under
    `lightning-bridge run` the run's hyperparameters, config and folders fill the defaults.
    `checkpoint_dir`: where checkpoints go (default: the config's `checkpoint_storage`
    `host_path`, else `./checkpoints`)."""
    deepspeed = _deepspeed()
    run = RunDescription.current()
    if run is not None:
        hparams = dict(run.hparams) if hparams is None else hparams
        exp_conf = dict(run.config) if exp_conf is None else exp_conf
        checkpoint_dir = run.checkpoint_dir if checkpoint_dir is None else checkpoint_dir
        if run.log_file is not None:
            _logging.configure(run.log_file)
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    if not torch.distributed.is_initialized():
        prepare_cpu_accelerator(deepspeed)
        deepspeed.init_distributed(
            dist_backend="nccl" if torch.cuda.is_available() else "gloo",
            auto_mpi_discovery=False,
        )
    if distributed is None:
        distributed = DistributedContext.from_torch_distributed()
    values = ConfigValues.of(exp_conf)
    seed = values.experiment_seed
    if seed is not None:
        # Identical seeds on every process, as Determined sets them before the trial is built.
        random.seed(seed)
        np.random.seed(seed)
        torch.random.manual_seed(seed)
    run_dir = run.run_dir if run is not None and run.run_dir is not None else pathlib.Path.cwd()
    context = DeepSpeedTrialContext(
        hparams,
        exp_conf,
        distributed,
        device=_device(distributed),
        trial_seed=seed,
        tensorboard_dir=run_dir / "tensorboard",
    )
    if checkpoint_dir is None:
        storage = values.checkpoint_storage or {}
        host = storage.get("host_path") if storage.get("type") == "shared_fs" else None
        checkpoint_dir = host if host else "checkpoints"
    _SETUPS[context] = DeepSpeedSetup(pathlib.Path(checkpoint_dir), run)
    try:
        yield context
    finally:
        close_tensorboard_writer(context)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DeepSpeedEngines:
    """The `LoopEngine` of a `DeepSpeedTrial`: its engines run their own forward, backward
    and step inside `train_batch`, so a step is a plain call; validation puts every engine
    in eval mode without gradients."""

    direct = True

    def __init__(self, context: DeepSpeedTrialContext) -> None:
        self.device: torch.device = context.device

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    @contextlib.contextmanager
    def evaluating(self, models: list[Any]) -> Iterator[None]:
        for model in models:
            model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for model in models:
                model.train()


class _Reports(FitObserver):
    """The fit's reports as the chief heard them (`Trainer.training_reports` and
    `validation_reports`)."""

    def __init__(self) -> None:
        self.training: list[dict[str, Any]] = []
        self.validation: list[dict[str, Any]] = []

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        self.training.append({**metrics, "batches": progress.batches})

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        self.validation.append({**metrics, "batches": progress.batches})


class Trainer:
    """Trains a `DeepSpeedTrial` with Determined's `Trainer.fit` arguments, on the fit's loop."""

    def __init__(self, trial: DeepSpeedTrial, context: DeepSpeedTrialContext) -> None:
        if not isinstance(context, DeepSpeedTrialContext):
            raise InvalidArgumentError(
                "deepspeed.Trainer(trial, context) needs the context from deepspeed.init(); got "
                f"{type(context).__name__}."
            )
        check_engine(context)
        self.trial = trial
        self.context = context
        self.checkpoints: list[pathlib.Path] = []
        # What the chief heard of the latest fit: one entry per report, with its batch.
        self.training_reports: list[dict[str, Any]] = []
        self.validation_reports: list[dict[str, Any]] = []

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit = Batch(100),  # noqa: B008 (an immutable value)
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
        *,
        trust_checkpoint: bool = False,
        warm_start: bool | None = None,
    ) -> None:
        """Train until `max_length`, validating, checkpointing and reporting at their periods;
        `latest_checkpoint` continues a run where it stopped (see `pytorch.Trainer.fit`)."""
        setup = _SETUPS.get(self.context) or DeepSpeedSetup(pathlib.Path("checkpoints"))
        run = setup.run
        if run is not None:
            max_length, test_mode, trust_checkpoint, warm_start = run.fit_defaults(
                max_length, test_mode, trust_checkpoint, warm_start
            )
        if profiling_enabled:
            logger.warning("profiling_enabled is not supported for a DeepSpeedTrial; ignored.")
        try:
            self._fit(
                setup,
                schedule=Schedule.for_fit(
                    max_length=max_length,
                    validation_period=validation_period,
                    checkpoint_period=checkpoint_period,
                    reporting_period=reporting_period,
                    test_mode=test_mode,
                    step_zero_validation=step_zero_validation,
                ),
                checkpoint_policy=checkpoint_policy,
                latest_checkpoint=latest_checkpoint,
                test_mode=test_mode,
                trust_checkpoint=trust_checkpoint,
                warm_start=warm_start,
            )
        except BridgeError as exc:
            raise exc.with_traceback(None) from None
        except RuntimeError as exc:
            refused = refused_backward(exc)
            if refused is None:
                raise
            if run is None:
                raise InvalidTrialError(refused) from None
            # The run's process: one line for the user, no traceback (the chief's).
            raise SystemExit(
                f"lightning-bridge: {refused}" if self.context.distributed.rank == 0 else 1
            ) from None

    def _fit(
        self,
        setup: DeepSpeedSetup,
        *,
        schedule: Schedule,
        checkpoint_policy: str,
        latest_checkpoint: str | None,
        test_mode: bool,
        trust_checkpoint: bool,
        warm_start: bool | None,
    ) -> None:
        ctx = self.context
        config = ConfigValues.of(ctx._exp_conf)
        checkpoint_policy = settled_policy(checkpoint_policy, config)
        ckpt_dir = setup.checkpoint_dir
        check_writable(ckpt_dir)
        core = DeepSpeedCore(
            self.trial, ctx, test_mode=test_mode, latest_checkpoint=latest_checkpoint
        )
        if latest_checkpoint is not None:
            path = resolve_checkpoint(latest_checkpoint, ckpt_dir)
            core.latest_checkpoint = str(path)
            state = read_trial_state(path, trusted=trust_checkpoint, trust_hint=TRUST_HINT)
            if starts_new_run(state, ctx.get_trial_id(), warm_start, str(path)):
                state = None
            core.continue_from(path, state)
        reports = _Reports()
        services = fit_services(
            setup.run,
            config,
            ckpt_dir,
            schedule=schedule,
            checkpoint_policy=checkpoint_policy,
            observers=core.observers,
            own_observers=[reports],
            is_chief=core.is_chief,
            test_mode=test_mode,
        )
        search, checkpointer = services.search, services.checkpointer
        loop = FitLoop(
            core,
            services.schedule,
            checkpointer,
            searcher_asks=(lambda: search.stopped) if search is not None else None,
            progress_bar=False,
        )
        try:
            outcome = loop.run(lambda: DeepSpeedEngines(ctx))
        finally:
            self.checkpoints = list(checkpointer.saved)
            self.training_reports = reports.training
            self.validation_reports = reports.validation
        if outcome.preempted_by is not None:
            stopped(
                outcome.preempted_by,
                services,
                ckpt_dir,
                core.state.batches_trained,
                core.is_chief,
            )


# DeepSpeed's refusal of a backward pass it does not run itself (`engine.backward`), from its
# PyTorch-style backward support on (0.18.3): with ZeRO stage 0 the hooks it needs are missing.
_REFUSED_BACKWARD = "Direct calls to tensor.backward() are not supported"
# The DeepSpeed releases that run a backward through an engine other than the one whose
# `backward()` is called (a GAN's generator loss through its discriminator engine).
BACKWARD_THROUGH_ENGINES = "0.16.9 to 0.18.2"


def refused_backward(exc: RuntimeError) -> str | None:
    """The user's message when DeepSpeed refused a backward pass through an engine that did
    not start it (ZeRO stage 0, DeepSpeed 0.18.3 and later), else None."""
    if _REFUSED_BACKWARD not in str(exc):
        return None
    return (
        f"DeepSpeed {_deepspeed().__version__} refuses this trial: with ZeRO stage 0 it runs "
        "no backward pass through an engine but that engine's own backward(), and the trial "
        "runs one otherwise (one engine's backward() through another engine, as a GAN's "
        "generator loss through its discriminator, or loss.backward()); DeepSpeed: "
        '"Direct calls to tensor.backward() are not supported in this configuration". '
        f"DeepSpeed {BACKWARD_THROUGH_ENGINES} runs it: "
        "pip install 'deepspeed>=0.16.9,<0.18.3'."
    )


def check_engine(context: DeepSpeedTrialContext) -> None:
    """Refuse what DeepSpeed cannot run here, with one message."""
    for engine in context.models:
        if context.device.type == "cpu" and engine.fp16_enabled():
            raise InvalidTrialError(
                "fp16 needs a GPU: DeepSpeed does not run fp16 on the CPU. Use "
                '"bf16": {"enabled": true} or fp32 in the DeepSpeed config.'
            )


__all__ = ["EXTRA", "Trainer", "init"]
