"""The handle of a started trial, and the one loop that follows a handle to its end.

`TrialProcess` is what every launcher's `start` returns: a local process (`_warm.ColdTrial`),
a trial forked by the warm process (`_warm.WarmTrial`), a Slurm job (`slurm._launcher.SlurmJob`)
or a trial placed on a Ray cluster (`ray._placement.RayTrial`). A search's worker follows it
with `pid`, `wait` and `send_signal`; a single trial's run (`Launcher.run_trial`) with
`follow`: the handle says it started, is followed to its end while the command's stop signals
escalate (`Escalation`: the first SIGINT / SIGTERM pauses the trial, a second kills it), and
its end is settled in the record (`settle_end`). A launcher's handle implements only what
differs: how it is followed, stopped and killed, and how its end reads.
"""

from __future__ import annotations

import abc
import contextlib
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_bridge.experiment.trial_process._signals import handling

if TYPE_CHECKING:  # the warm process imports the handle: the record is not its to load
    from lightning_bridge.record._registry import Registry


class TrialProcess(abc.ABC):
    """A started trial as whoever started it follows it."""

    @property
    def pid(self) -> int:
        """The trial's process on this machine (0: none here, a scheduler's work)."""
        return 0

    @abc.abstractmethod
    def wait(self) -> int:
        """Block until the trial's process or job ends; its exit code (a search's worker
        calls it from a thread of its own)."""

    @abc.abstractmethod
    def send_signal(self, sig: int) -> None:
        """SIGTERM: checkpoint and stop; SIGKILL: end now."""

    # ----- a single trial's run (`follow`) -----

    def announce(self) -> str:
        """The line the command prints once the trial started: what runs it, its output."""
        return f"Trial process {self.pid} started"

    def follow(self, registry: Registry) -> int:
        """Run the trial to its end from the command that started it (the main thread, whose
        stop signals `follow` handles), recording in `registry` what changes; its exit code."""
        return self.wait()

    def stop(self, kill: bool) -> None:
        """Pause the trial (it checkpoints and stops), or `kill` it."""
        self.send_signal(signal.SIGKILL if kill else signal.SIGTERM)

    def stopping(self, kill: bool) -> str:
        """The line the command prints as it pauses (or, `kill`, kills) the trial."""
        what = "Killing" if kill else "Pausing"
        return f"{what} trial process {self.pid}: the trial checkpoints and stops"

    def settle(self, registry: Registry, trial_id: int, code: int, paused: bool) -> int:
        """The exit code of the command once the trial ended with `code` (`paused`: the
        command was signalled): its recorded end (`settle_end`)."""
        failed = f"its process ended (exit code {code}) without the trial recording an end"
        return settle_end(registry, trial_id, "stopped" if paused else None, failed)


class Escalation:
    """The command's stop signals while it follows a trial: the first pauses it (the trial
    checkpoints and stops), any later one kills it; each says so in one line. Call it as a
    signal handler; `count` is how many came."""

    def __init__(self, stop: Callable[[bool], None], say: Callable[[bool], str]) -> None:
        self._stop = stop
        self._say = say
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        kill = self.count > 1
        self._stop(kill)
        with contextlib.suppress(OSError, RuntimeError):  # a signal while printing
            print(self._say(kill), flush=True)


def follow(registry: Registry, trial_id: int, handle: TrialProcess) -> int:
    """A started trial run to its end: its start said, its stop signals escalated, its end
    settled (the contract's `Launcher.run_trial`); the command's exit code."""
    print(handle.announce(), flush=True)
    signals = Escalation(handle.stop, handle.stopping)
    with handling(signals):
        code = handle.follow(registry)
    return handle.settle(registry, trial_id, code, paused=bool(signals.count))


def settle_end(registry: Registry, trial_id: int, stopped: str | None, failed: str) -> int:
    """The exit code of a trial whose launcher's work ended (its job, its placement): its
    recorded end; one it did not record (killed, cancelled, its node lost) is recorded
    STOPPED with `stopped` where the run was paused, else ERROR with `failed`. An error is
    printed, in one line."""
    from lightning_bridge.record._schema import TrialState

    recorded = registry.trial(trial_id)
    if recorded.state == TrialState.ACTIVE.value:
        if stopped is not None:
            registry.trial_ended(trial_id, TrialState.STOPPED, stopped)
        else:
            registry.trial_ended(trial_id, TrialState.ERROR, failed)
        recorded = registry.trial(trial_id)
    if recorded.state == TrialState.ERROR.value:
        print(f"lightning-bridge: error: trial {trial_id}: {recorded.message}", file=sys.stderr)
        return 1
    return 0
