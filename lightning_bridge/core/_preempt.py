"""The preemption signal a Core API script polls (`core_context.preempt`)."""

from __future__ import annotations

import enum
from typing import Any

from lightning_bridge.contract._distributed import DistributedContext


class PreemptMode(enum.Enum):
    """Which ranks ask for the signal: all on their own, the chief for all (broadcast), or
    the chief alone."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Off `lightning-bridge run` nothing preempts a script: `should_preempt()` is False,
    as in Determined's off-cluster mode. It must be started (the Context does) before use."""

    def __init__(
        self, dist: DistributedContext, preempt_mode: PreemptMode = PreemptMode.WorkersAskChief
    ) -> None:
        self._dist = dist
        self._mode = PreemptMode(preempt_mode)
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
        """Whether the script should checkpoint and exit now (never, off a run)."""
        if not self._started:
            raise RuntimeError(
                "should_preempt() needs a started PreemptContext: use it inside "
                "`with det.core.init() as core_context:`."
            )
        if self._mode == PreemptMode.ChiefOnly and self._dist.rank != 0:
            raise RuntimeError(
                "should_preempt() with preempt_mode=ChiefOnly is for the chief (rank 0) only."
            )
        return False

    def acknowledge_preemption_signal(self) -> None:
        """Nothing to acknowledge off a run."""
