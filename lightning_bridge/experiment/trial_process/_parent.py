"""A search's trial process stops with the worker that started it.

The worker names itself in `LIGHTNING_BRIDGE_SEARCH_WORKER`; the trial's process asks Linux
to send it SIGTERM when that parent dies (`prctl(PR_SET_PDEATHSIG)`), so a worker killed
outright does not leave trials training for nobody: each stops as on Ctrl-C (finish the
batch, checkpoint, give the trial back to the search). Elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "LIGHTNING_BRIDGE_SEARCH_WORKER"
_PR_SET_PDEATHSIG = 1


def follow_parent() -> None:
    """In a trial process started by a search worker: SIGTERM when the worker dies."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux") or str(os.getppid()) != parent:
        return  # not started by a worker (or a rank the trial's own launcher started)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # the worker died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
