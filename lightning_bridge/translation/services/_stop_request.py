"""`StopRequest`: what asks a fit to stop, and the stop every process agrees on.

The fit's loop owns one and polls it. Three things ask: a signal (SIGTERM / SIGINT: the loop
checkpoints and exits, to continue later), the trial (`context.set_stop_requested(True)`) and
a search's searcher (its decision after a validation, the chief's, shared with every process);
the last two end the fit early, at the boundary where they are seen. A fourth ends it with an
error: a process that failed alone at a boundary (the chief holding the checkpoint directory,
writing a checkpoint). Every process learns of it at that boundary (`agree`), and all raise
the same error, rather than the others going on into a collective the failed one never joins.

A signal only sets a flag; the fit acts on it after a batch, once that batch's validation and
checkpoint boundaries are handled. With several processes the flags must be agreed on, or one
process would checkpoint (a collective) while another is already in the next batch (another
collective) and both would wait until the timeout.

The agreement is an all-reduce (MAX) of every process's flag (the signal's number, 0 for none)
on a small gloo group of its own. It is cheap on the per-batch path: it is started after one
batch and read a few batches later, when it has long completed, and the reads are spaced so
that about `INTERVAL_S` of training passes between them (every process proposes a spacing from
its own batch times; the same all-reduce agrees on the smallest). Every process reads the same
values after the same batches, so all stop after the same one, at most about two spacings
after the signal. A single process reads its own flag after every batch.

The fit runs on `lightning.Fabric`, which installs no signal handler of its own (unlike
`lightning.Trainer`, whose SIGTERM handler broadcasts from inside the handler, pairing with
whatever collective the other processes are in).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from lightning_bridge.contract._distributed import DistributedContext

logger = logging.getLogger("lightning_bridge")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
INTERVAL_S = 0.1  # training time between two agreements
MAX_SPACING = 1000  # batches between two agreements, at most


class StopRequest:
    """The requests to stop a fit, and the stop every process agrees on."""

    def __init__(
        self,
        distributed: DistributedContext | None = None,
        *,
        trial_asks: Callable[[], bool] | None = None,
        searcher_asks: Callable[[], bool] | None = None,
    ) -> None:
        self._distributed = distributed
        self._trial_asks = trial_asks
        # The chief's searcher: whether it stopped the trial (None: no search).
        self._searcher_asks = searcher_asks
        self.by_searcher = False  # the searcher stopped the fit (every process agrees)
        self.failure: str | None = None  # a process failed at a boundary (every one agrees)
        self.received = 0  # the first signal this process got (its number), 0 for none
        self._previous: dict[int, Any] = {}
        self._group: Any = None
        self._values: torch.Tensor | None = None
        self._pending: Any = None
        self._batches = 0  # batches polled so far
        self._read_at = 0  # the batch count after which the pending all-reduce is read
        self._started = (0.0, 0)  # when (time, batch count) it was started

    # ----- signal handlers (installed for the whole fit) -----

    def install(self) -> None:
        """Catch SIGTERM / SIGINT (main thread only: Python delivers signals there)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.received:
            self.received = signum

    # ----- the trial and the searcher -----

    def early(self) -> bool:
        """Whether the trial or the searcher asks the fit to end at this boundary."""
        return self.by_searcher or (self._trial_asks is not None and self._trial_asks())

    def after_validation(self) -> None:
        """Every process learns the searcher's decision on the validation just reported."""
        if self._searcher_asks is None:
            return
        asks = self._searcher_asks()
        if self._distributed is not None:
            asks = self._distributed.broadcast(asks)
        self.by_searcher = bool(asks)

    # ----- a failure on one process -----

    def agree(self, failure: str | None, error: type[Exception], chief_value: Any = None) -> Any:
        """At a boundary where a process may fail alone, every process learns whether one did:
        all then stop with `error(failure)` (the first failed process's message); otherwise
        every process gets the chief's `chief_value`. Every process calls it at the same
        boundary, with its own `failure` (None: its part went well)."""
        everyone: list[Any] = [(failure, chief_value)]
        if self._distributed is not None:
            everyone = self._distributed.allgather((failure, chief_value))
        failed = [message for message, _ in everyone if message]
        if failed:
            self.failure = failed[0]
            raise error(self.failure)
        return everyone[0][1]

    # ----- agreement on signals across processes -----

    def begin(self) -> None:
        """Set up the agreement; every process calls this once, before the first batch."""
        if self._group is not None or not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_world_size() < 2:
            return
        self._group = dist.new_group(backend="gloo")

    def poll(self) -> int:
        """The signal to stop on after this batch (0: go on). Every process calls it after
        every batch and gets the same answer after the same batch."""
        if self._group is None:
            return self.received
        self._batches += 1
        if self._pending is None:  # the first batch
            self._start(spacing=1)
            return 0
        if self._batches < self._read_at:
            return 0
        assert self._values is not None
        self._pending.wait()
        self._pending = None
        agreed, spacing = int(self._values[0]), -int(self._values[1])
        if not agreed:
            self._start(spacing)
        return agreed

    def _start(self, spacing: int) -> None:
        """Start the all-reduce to read `spacing` batches from now: this process's flag, and
        the spacing it proposes for the next one (from its batch times so far)."""
        now = time.monotonic()
        proposal = 1
        since, batch = self._started
        if since:
            per_batch = (now - since) / max(self._batches - batch, 1)
            proposal = MAX_SPACING if per_batch <= 0 else math.floor(INTERVAL_S / per_batch)
        proposal = max(1, min(MAX_SPACING, proposal))
        self._values = torch.tensor([self.received, -proposal], dtype=torch.int64)
        self._pending = dist.all_reduce(
            self._values, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        self._read_at = self._batches + spacing
        self._started = (now, self._batches)

    def end(self, wait: bool = True) -> None:
        """Finish the agreement. At the end of a fit every process has started the same
        all-reduces, so the last one completes; after an error (`wait=False`) another process
        may never start it, so it is left behind with the process group."""
        if self._group is None:
            return
        if wait:
            try:
                if self._pending is not None:
                    self._pending.wait()
                dist.destroy_process_group(self._group)
            except Exception as exc:  # noqa: BLE001 - the fit's own outcome is what matters
                logger.debug("Ending the stop agreement: %s", exc)
        self._group = self._pending = self._values = None
