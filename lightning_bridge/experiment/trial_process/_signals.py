"""The one way the experiment layer takes its stop signals: `handling`, a scope that installs
a handler for SIGINT and SIGTERM (or the signals given) and puts the previous ones back.

Python lets only the main thread install handlers; elsewhere (a test's thread, a worker run
from a thread) the scope installs nothing and the process keeps its handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
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
