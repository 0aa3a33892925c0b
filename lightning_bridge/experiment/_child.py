"""Running a script entrypoint as a child process that stops when the runner is told to.

The script runs in a process group of its own, so a terminal's Ctrl-C reaches the runner only;
SIGTERM, SIGINT and SIGHUP sent to the runner are passed on to the whole group (the script and
any process it started), and the runner keeps waiting: a script on the bridge finishes its
batch, checkpoints and exits 0, and its exit code is the runner's. If it is still running
`timeout` seconds after the first signal, the group is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger("lightning_bridge")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class ChildRun:
    """The outcome of a child run: its exit code and the signal passed on to it, if any."""

    def __init__(self, code: int, forwarded: int, killed: bool) -> None:
        self.code = code
        self.forwarded = forwarded
        self.killed = killed

    def describe_failure(self, timeout: float) -> str:
        """The one-line message for a non-zero exit (see `run_child`)."""
        if self.killed:
            return (
                f"the entrypoint was still running {timeout:g} s after "
                f"{signal.Signals(self.forwarded).name} and was killed; checkpoints written "
                "before are intact, a save in progress is lost"
            )
        if self.code < 0:
            return f"the entrypoint was killed by {signal.Signals(-self.code).name}"
        if self.forwarded:
            return (
                f"the entrypoint exited with code {self.code} after "
                f"{signal.Signals(self.forwarded).name}"
            )
        return f"the entrypoint exited with code {self.code}"

    @property
    def exit_code(self) -> int:
        """The code for the runner to exit with: the child's, 128 + N for signal N."""
        return self.code if self.code >= 0 else 128 - self.code


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def run_child(
    command: Sequence[str],
    *,
    cwd: Any,
    env: Mapping[str, str],
    timeout: float,
    margin: float = 0,
) -> ChildRun:
    """Run `command` in its own process group, passing on the runner's stop signals (see the
    module docstring); the group is killed `timeout` + `margin` seconds after the first (the
    margin is for a child that enforces `timeout` itself). Raises FileNotFoundError when the
    command does not exist."""
    forwarded: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: Any) -> None:
        if not forwarded:
            logger.info(
                "%s: passed on to the entrypoint, which checkpoints and stops (killed if "
                "still running after %g s)",
                signal.Signals(signum).name,
                timeout,
            )
        forwarded.append(signum)
        if started:
            _signal_group(started[0].pid, signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env), process_group=0)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.append(proc)
    if forwarded:  # a signal came while the child was starting
        _signal_group(proc.pid, forwarded[0])
    killed = False
    deadline: float | None = None
    try:
        while True:
            try:
                # Wake up now and then to enforce the deadline; a signal interrupts the wait.
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if forwarded and deadline is None:
                deadline = time.monotonic() + timeout + margin
            if deadline is not None and not killed and time.monotonic() > deadline:
                _signal_group(proc.pid, signal.SIGKILL)
                killed = True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # the runner itself is failing: leave nothing behind
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    return ChildRun(code, forwarded[0] if forwarded else 0, killed)
