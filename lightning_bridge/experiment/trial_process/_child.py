"""Running a script entrypoint as a child process that stops when the runner is told to.

The script runs in a process group of its own. SIGTERM, SIGINT and SIGHUP sent to the runner
are passed on to that whole group (the script and the processes it started), and the runner
keeps waiting: a script on the bridge finishes its batch, checkpoints and exits 0, and its exit
code is the runner's. If it is still running `timeout` seconds after the first signal, the
group is killed.

Started from a terminal, the runner hands the terminal to the script's group while it runs, as
a shell does for a job: the script can read it (`input()`, `breakpoint()`), and Ctrl-C and
Ctrl-Z reach it directly. When the script is stopped (Ctrl-Z) the runner takes the terminal
back and stops too, so the shell regains control; `fg` continues both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_bridge._errors import BridgeError
from lightning_bridge.experiment.trial_process._signals import handling

logger = logging.getLogger("lightning_bridge")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL_S = 0.1


class EntrypointFailed(BridgeError):
    """A script entrypoint that ended badly after a stop signal, or was ended by a signal: the
    message says how, `code` is the command's exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class ChildRun:
    """The outcome of a child run: its exit code and the signal passed on to it, if any."""

    def __init__(self, code: int, forwarded: int, killed: bool) -> None:
        self.code = code
        self.forwarded = forwarded
        self.killed = killed

    def describe_failure(self, timeout: float) -> str:
        """The one-line message for a non-zero exit."""
        name = signal.Signals(self.forwarded).name if self.forwarded else ""
        if self.killed:
            return (
                f"the entrypoint was still running {timeout:g} s after {name} and was killed; "
                "checkpoints written before are intact, a save in progress is lost"
            )
        if self.code < 0:
            return f"the entrypoint was killed by {signal.Signals(-self.code).name}"
        if self.forwarded:
            return f"the entrypoint exited with code {self.code} after {name}"
        return f"the entrypoint exited with code {self.code}"

    @property
    def exit_code(self) -> int:
        """The code for the runner to exit with: the child's, 128 + N for signal N."""
        return self.code if self.code >= 0 else 128 - self.code


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class _Terminal:
    """The controlling terminal, when the runner is its foreground job (else does nothing)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                self.fd = 0

    def give(self, pgid: int) -> None:
        if self.fd is not None:
            try:
                os.tcsetpgrp(self.fd, pgid)
            except OSError:
                self.fd = None
            _signal_group(pgid, signal.SIGCONT)  # in case it read the terminal too early

    def take_back(self) -> None:
        if self.fd is None:
            return
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background tcsetpgrp
        try:
            os.tcsetpgrp(self.fd, os.getpgrp())
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, previous)


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
    group: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if not forwarded:
            logger.info(
                "%s: passed on to the entrypoint, which checkpoints and stops (killed if "
                "still running after %g s)",
                signal.Signals(signum).name,
                timeout,
            )
        forwarded.append(signum)
        if group:
            _signal_group(group[0], signum)

    terminal = _Terminal()
    with handling(forward, FORWARDED):
        try:
            proc = subprocess.Popen(list(command), cwd=cwd, env=dict(env), process_group=0)
            group.append(proc.pid)
            terminal.give(proc.pid)
            if forwarded:  # a signal came while the child was starting
                _signal_group(proc.pid, forwarded[0])
            code, killed = _wait(proc, terminal, forwarded, timeout + margin)
        finally:
            terminal.take_back()
            if group and _running(group[0]):  # the runner itself is failing: leave nothing
                _signal_group(group[0], signal.SIGKILL)
    return ChildRun(code, forwarded[0] if forwarded else 0, killed)


def _running(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _wait(
    proc: subprocess.Popen[bytes], terminal: _Terminal, forwarded: list[int], limit: float
) -> tuple[int, bool]:
    """Wait for the child: its exit code, and whether it was killed at the deadline."""
    deadline: float | None = None
    killed = False
    while True:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):  # Ctrl-Z: stop with it, give the shell control
            terminal.take_back()
            os.kill(os.getpid(), signal.SIGSTOP)
            terminal.give(proc.pid)
            _signal_group(proc.pid, signal.SIGCONT)
            continue
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, killed
        if forwarded and deadline is None:
            deadline = time.monotonic() + limit
        if deadline is not None and not killed and time.monotonic() > deadline:
            _signal_group(proc.pid, signal.SIGKILL)
            killed = True
        time.sleep(_POLL_S)
