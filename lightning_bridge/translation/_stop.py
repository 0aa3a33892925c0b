"""Stopping a fit on SIGTERM / SIGINT: every process stops after the same batch.

A signal only sets a flag; the fit acts on it after a batch, once that batch's validation and
checkpoint boundaries are handled. With several processes the flags must be agreed on, or one
process would checkpoint (a collective) while another is already in the next batch (another
collective) and both would wait until the timeout. So after every batch each process adds its
flag (the signal's number, 0 for none) to an all-reduce (MAX) on a small gloo group of its own.
The all-reduce is started after batch n and read after batch n + 1: every process reads the
same value after the same batch, and the collective's latency hides behind a batch of
training (a stop comes one batch later than in a single process, which reads its flag at once).

Lightning's own SIGTERM handling is kept out of the way (`keep_signal_handlers`): its handler
broadcasts from inside the signal handler, which pairs with whatever collective the other
processes are in.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger("lightning_bridge")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The signals asking a fit to stop, and the stop every process agrees on."""

    def __init__(self) -> None:
        self.received = 0  # the first signal this process got (its number), 0 for none
        self._previous: dict[int, Any] = {}
        self._group: Any = None
        self._flag: torch.Tensor | None = None
        self._pending: Any = None

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

    # ----- agreement across processes -----

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
        agreed = 0
        if self._pending is not None:
            assert self._flag is not None
            self._pending.wait()
            agreed = int(self._flag.item())
            self._pending = None
        if not agreed:
            self._flag = torch.tensor([self.received], dtype=torch.int32)
            self._pending = dist.all_reduce(
                self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
            )
        return agreed

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
        self._group = self._pending = self._flag = None
