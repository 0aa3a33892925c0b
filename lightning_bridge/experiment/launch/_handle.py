"""`TrialProcess`: a started trial as whoever started it follows it (the handle a launcher
returns): a local process (`subprocess.Popen`), a trial forked by the warm process
(`_warm.WarmTrial`), a scheduler's job (`slurm._launcher.SlurmJob`) or a trial placed on a
Ray cluster (`ray._launcher.RayTrial`)."""

from __future__ import annotations

from typing import Protocol


class TrialProcess(Protocol):
    """What a search's worker needs of a started trial."""

    @property
    def pid(self) -> int:
        """The trial's process on this machine (0: none here, a scheduler's job)."""
        ...

    def wait(self) -> int:
        """Block until the trial's process or job ends; its exit code."""
        ...

    def send_signal(self, sig: int) -> None:
        """SIGTERM: checkpoint and stop; SIGKILL: end now."""
        ...
