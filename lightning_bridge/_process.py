"""Whether a process of this machine is still running: how the record and the search tell
a crashed trial or worker (its pid gone) from a live one."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
