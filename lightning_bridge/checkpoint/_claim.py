"""Which runs use a checkpoint directory, so that no run removes another run's save.

A training run holds a lock file in its checkpoint directory, `.run.<id>.lock`: created under a
temporary name, locked (`flock`, exclusive) and only then renamed into place, so it is never
seen unlocked while its run lives. The kernel drops the lock when the process ends, however it
ends, so a lock file that can be locked belongs to a run that is gone (it is removed).

The leftovers of interrupted saves (`.<id>.partial` directories, `.latest.<id>` pointer files)
are removed when a run starts, unless another live run holds the directory: they could be its
saves in progress. That run is named in a warning instead.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pathlib
import shutil
import socket
import sys
import uuid
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks, leftovers are kept
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("lightning_bridge")

LOCK_GLOB = ".run.*.lock"
NEW_LOCK_GLOB = ".run.*.new"  # a lock file being created (or left by a run that died then)
LEFTOVER_GLOBS = (".*.partial", ".latest.*")


def _try_lock(fd: int, exclusive: bool) -> bool:
    assert fcntl is not None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def live_holders(base_dir: pathlib.Path, own: pathlib.Path | None = None) -> list[dict[str, Any]]:
    """What the live runs holding `base_dir` wrote about themselves (pid, host, start, command);
    lock files of ended runs are removed on the way."""
    if fcntl is None or not base_dir.is_dir():
        return []
    holders = []
    for lock in sorted([*base_dir.glob(LOCK_GLOB), *base_dir.glob(NEW_LOCK_GLOB)]):
        if own is not None and lock == own:
            continue
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            continue
        try:
            if _try_lock(fd, exclusive=False):
                with contextlib.suppress(OSError):
                    lock.unlink()
                continue
            if lock.name.endswith(".new"):  # a run starting right now; it is listed soon
                continue
            try:
                info = json.loads(os.read(fd, 65536) or b"{}")
            except ValueError:
                info = {}
            holders.append(info if isinstance(info, dict) else {})
        finally:
            os.close(fd)
    return holders


def describe(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
        f"{holder.get('started', '?')}: {holder.get('command', '?')}"
    )


def remove_leftovers(base_dir: pathlib.Path) -> None:
    """Delete what interrupted saves left behind (never a complete checkpoint)."""
    for pattern in LEFTOVER_GLOBS:
        for leftover in base_dir.glob(pattern):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _command() -> str:
    """This process's command line, as the user typed it (`python -m pkg` for a package)."""
    argv = list(sys.argv) or ["python"]
    head = pathlib.Path(argv[0])
    if head.name == "__main__.py":
        argv[0] = f"python -m {head.parent.name}"
    return " ".join(argv)[:500]


class DirectoryClaim:
    """This run's hold on a checkpoint directory (see the module docstring)."""

    def __init__(self, base_dir: pathlib.Path) -> None:
        self.base_dir = base_dir
        self.path: pathlib.Path | None = None
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the directory; remove leftovers unless another live run holds it too (then
        warn, naming that run)."""
        if fcntl is not None:
            self._lock()
        others = live_holders(self.base_dir, own=self.path)
        if fcntl is None:
            return
        if not others:
            remove_leftovers(self.base_dir)
            return
        logger.warning(
            "another run is using the checkpoint directory %s (%s); its unfinished saves are "
            "left alone, and `latest` there names whichever run saved last: continue a run "
            "from its own checkpoint path. Give each run its own checkpoint directory "
            "(checkpoint_storage.host_path) to keep them apart.",
            self.base_dir,
            "; ".join(describe(h) for h in others),
        )

    def _lock(self) -> None:
        for attempt in range(3):
            try:
                self._try_lock_file()
                return
            except FileNotFoundError:  # another run took the new file for a dead run's
                if attempt == 2:
                    raise

    def _try_lock_file(self) -> None:
        assert fcntl is not None
        token = uuid.uuid4().hex[:12]
        tmp = self.base_dir / f".run.{token}.new"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.datetime.now().isoformat(timespec="seconds"),
                "command": _command(),
            }
            os.write(fd, json.dumps(info).encode())
            path = self.base_dir / f".run.{token}.lock"
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._fd, self.path = fd, path

    def release(self) -> None:
        if self._fd is None:
            return
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)
        self._fd = self.path = None
