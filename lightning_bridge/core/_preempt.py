"""The preemption signal a Core API script polls (`core_context.preempt`).

Off `lightning-bridge run` nothing preempts a script (Determined's off-cluster mode). Under
it, the trial's `StopRequest` (`CoreRun`) says whether to checkpoint and exit: a stop signal
(`experiment pause`; on Slurm, the signal before a cancel, a requeue or the time limit; Ctrl-C)
or the searcher stopping the trial. With `WorkersAskChief` the chief decides and every process
gets its answer, so all stop after the same step."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from lightning_bridge.contract._distributed import DistributedContext

if TYPE_CHECKING:
    from lightning_bridge.core._run import CoreRun


class PreemptMode(enum.Enum):
    """Which ranks ask for the signal: all on their own, the chief for all (broadcast), or
    the chief alone."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Whether the script should checkpoint and exit (see the module docstring). It must be
    started (the Context does) before use."""

    def __init__(
        self,
        dist: DistributedContext,
        preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
        run: CoreRun | None = None,
    ) -> None:
        self._dist = dist
        self._mode = PreemptMode(preempt_mode)
        self._run = run
        self._started = False

    def start(self) -> PreemptContext:
        if self._started:
            raise RuntimeError("PreemptContext.start() was already called; call it once.")
        self._started = True
        return self

    def close(self) -> None:
        """Nothing to stop off a run."""

    def __enter__(self) -> PreemptContext:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """Whether the script should checkpoint and exit now (never, off a run). Every
        process calls it at the same step under WorkersAskChief (the chief's answer is
        broadcast)."""
        if not self._started:
            raise RuntimeError(
                "should_preempt() needs a started PreemptContext: use it inside "
                "`with det.core.init() as core_context:`."
            )
        if self._mode == PreemptMode.ChiefOnly and self._dist.rank != 0:
            raise RuntimeError(
                "should_preempt() with preempt_mode=ChiefOnly is for the chief (rank 0) only."
            )
        run = self._run
        if run is None:
            return False
        if self._mode == PreemptMode.WorkersAskChief:
            return bool(self._dist.broadcast(run.signalled() if self._dist.rank == 0 else None))
        return run.signalled()

    def acknowledge_preemption_signal(self) -> None:
        """The script will stop (Determined's master is told so; here the stop request
        already holds it)."""
