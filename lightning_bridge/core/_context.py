"""`det.core.init()` and its `Context`: the Core API's face over the bridge's services.

Off `lightning-bridge run` (a plain `python3 train.py`) it answers as Determined 0.38.1's
off-cluster mode does: metrics are logged, the searcher yields one operation of length 1,
nothing preempts, and checkpoints go to `checkpoint_storage` (the bridge's storage). Under the
command it answers as a Determined cluster does, through the trial's services (`CoreRun`): the
record, the config's checkpoint storage and retention, a search, TensorBoard, the MLflow
mirror, and the stop signals the launchers send.
"""

from __future__ import annotations

import logging
import types
from typing import Any

from lightning_bridge._errors import is_invalid_hp
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.core._checkpoint import CheckpointContext, storage_from_argument
from lightning_bridge.core._preempt import PreemptContext, PreemptMode
from lightning_bridge.core._run import CoreRun
from lightning_bridge.core._searcher import (
    SearcherContext,
    SearcherContextMissing,
    configured_length,
)
from lightning_bridge.core._tensorboard_mode import TensorboardMode
from lightning_bridge.core._train import EarlyExitReason, TrainContext
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge.core")


class DummyDistributedContext(DistributedContext):
    """The context of a single process (Determined's name for it)."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)


class ProfilerContext:
    """`core_context.profiler`: accepted; system metrics are not sampled (one warning)."""

    _warned = False

    def _warn(self) -> None:
        if not ProfilerContext._warned:
            ProfilerContext._warned = True
            logger.warning(
                "core_context.profiler: lightning_bridge does not sample system metrics; "
                "profile with Lightning's profilers or torch.profiler instead."
            )

    def on(self, sampling_interval: float = 1, samples_per_report: int = 10) -> None:
        self._warn()

    def off(self) -> None:
        """Nothing was sampled, so nothing stops."""

    def close(self) -> None:
        """Nothing to close."""


class ExperimentalCoreContext:
    """`core_context.experimental`: the Determined-master-only calls, answered with a word."""

    def report_task_using_model_version(self, model_version: Any) -> None:
        logger.warning("report_task_using_model_version(): model lineage is not recorded.")

    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        logger.warning("report_task_using_checkpoint(): checkpoint lineage is not recorded.")


class Context:
    """What `with det.core.init() as core_context:` holds."""

    def __init__(
        self,
        checkpoint: CheckpointContext,
        distributed: DistributedContext,
        preempt: PreemptContext,
        train: TrainContext,
        searcher: SearcherContext,
        profiler: ProfilerContext | None = None,
        experimental: ExperimentalCoreContext | None = None,
        run: CoreRun | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.distributed = distributed
        self.preempt = preempt
        self.train = train
        self.searcher = searcher
        self.profiler = profiler or ProfilerContext()
        self.experimental = experimental or ExperimentalCoreContext()
        self._run = run

    def start(self) -> None:
        self.preempt.start()
        if self._run is not None:
            self._run.start()

    def __enter__(self) -> Context:
        self.start()
        return self

    def alert(
        self, title: str | None = None, description: str | None = None, level: str = "INFO"
    ) -> None:
        """Determined sends alerts through its master's webhooks; here they are logged."""
        logger.warning("alert (%s): %s: %s", level, title or "", description or "")

    def close(
        self,
        exc_type: type | None = None,
        exc_val: BaseException | None = None,
        exc_tb: types.TracebackType | None = None,
    ) -> None:
        """Stop the contexts; under a run, record how the trial ended (`exc_val`: the
        exception leaving the script's `with`, if any)."""
        self.preempt.close()
        ended_well = exc_val is None or (
            isinstance(exc_val, SystemExit) and exc_val.code in (0, None)
        )
        self.distributed._close(wait=ended_well)
        self.profiler.close()
        if self._run is not None:
            self._run.close(exc_val)

    def __exit__(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        if value is not None and is_invalid_hp(value):
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            self.close(typ, value, tb)
            logger.info("InvalidHP detected during Trial init, converting InvalidHP to exit(0)")
            raise SystemExit(0)
        self.close(typ, value, tb)


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """Determined's `core.init()`: the contexts of a Core API script (see the module docstring)."""
    distributed = distributed or DummyDistributedContext()
    tensorboard_mode = TensorboardMode(tensorboard_mode)
    described = RunDescription.current()
    if described is None:
        storage = storage_from_argument(checkpoint_storage)
        if checkpoint_storage is None:
            logger.info("no checkpoint_storage given; storing checkpoints in %s", storage.root)
        return Context(
            checkpoint=CheckpointContext(distributed, storage),
            distributed=distributed,
            preempt=PreemptContext(distributed, preempt_mode),
            train=TrainContext(None),
            searcher=SearcherContext(distributed),
        )
    return context_for_run(
        described, distributed, checkpoint_storage, preempt_mode, tensorboard_mode
    )


def context_for_run(
    described: RunDescription,
    distributed: DistributedContext,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """The contexts of a recorded trial's script (`described`): its services (`CoreRun`)."""
    run = CoreRun(described, distributed, tensorboard_mode == TensorboardMode.AUTO)
    if checkpoint_storage is not None and described.options.get("unmanaged") is None:
        logger.warning(
            "core.init(checkpoint_storage=...) is not used under lightning-bridge run: the "
            "trial's checkpoints go to the config's checkpoint_storage (%s), where `experiment "
            "continue` and `checkpoint list` find them.",
            run.storage.root,
        )
    length, units = configured_length(described.config)
    searcher = SearcherContext(distributed, length, units) if length else SearcherContextMissing()
    return Context(
        checkpoint=CheckpointContext(distributed, run.storage, run),
        distributed=distributed,
        preempt=PreemptContext(distributed, preempt_mode, run),
        train=TrainContext(
            run.tensorboard_dir, run, manual_tensorboard=tensorboard_mode == TensorboardMode.MANUAL
        ),
        searcher=searcher,
        run=run,
    )
