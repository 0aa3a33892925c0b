"""The one way the experiment layer takes its stop signals: `handling`, a scope that installs
a handler for SIGINT and SIGTERM (or the signals given) and puts the previous ones back.

Python lets only the main thread install handlers; elsewhere (a test's thread, a worker run
from a thread) the scope installs nothing and the process keeps its handlers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, Any], Any]


@contextlib.contextmanager
def handling(handler: Handler, signals: Iterable[int] = STOP_SIGNALS) -> Iterator[bool]:
    """Run the block with `handler` taking `signals`; yields whether it was installed (only
    the main thread can)."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield bool(previous)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def held_until_training(signals: Iterable[int] = (signal.SIGTERM,)) -> Iterator[list[int]]:
    """Run the block (a trial's process, from its start) holding the first stop signal that
    comes before the fit takes the signals itself: it is sent again once the fit's handler is
    in place, so a trial paused while it still imports stops after its first batch,
    checkpointed and recorded, rather than dying unrecorded. Yields the signals held."""
    held: list[int] = []
    ended = threading.Event()

    def resend(signum: int, ours: Handler) -> None:
        while not ended.is_set():
            handler = signal.getsignal(signum)
            if callable(handler) and handler is not ours:
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.05)

    def on_signal(signum: int, frame: Any) -> None:
        if not held:
            held.append(signum)
            threading.Thread(target=resend, args=(signum, on_signal), daemon=True).start()

    with handling(on_signal, signals):
        try:
            yield held
        finally:
            ended.set()
