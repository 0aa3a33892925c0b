"""Where a trial runs: a launcher starts a trial's processes and waits for its end.

`run --launcher NAME` picks one (`_launchers.launcher_for`); the experiment's record keeps the
name (in its options), so `experiment continue` starts its trials the same way. `local` runs
the trial on this machine as `run` always has; `slurm` submits each trial as an `sbatch` job
(`_slurm`). A launcher checks
what it needs before anything is recorded or submitted (`check`), then runs each trial to its
end (`run_trial`), which records how it ended either way.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Protocol

from lightning_bridge.experiment import _experiments, _runner
from lightning_bridge.record._registry import Registry


class TrialProcess(Protocol):
    """A started trial as a search's worker follows it: a local process (`Popen`) or a
    scheduler's job."""

    def wait(self) -> int:
        """Block until the trial's process or job ends; its exit code."""
        ...

    def send_signal(self, sig: int) -> None:
        """SIGTERM: checkpoint and stop; SIGKILL: end now."""
        ...


class Launcher(abc.ABC):
    """Starts a trial where it runs and reports its end (Lightning's strategies' style)."""

    name: ClassVar[str]

    def check(self, plan: _runner.Plan) -> None:  # noqa: B027 - most launchers need nothing
        """Refuse a plan this launcher cannot run (InvalidArgumentError), before anything is
        recorded or submitted."""

    def start(
        self, registry: Registry, plan: _runner.Plan, trial: _runner.TrialRun
    ) -> TrialProcess:
        """Start a search's recorded trial and return at once (a search's worker follows it);
        the local launcher's is the worker's own subprocess start."""
        raise NotImplementedError(f"the {self.name} launcher starts a search's trials itself")

    @abc.abstractmethod
    def run_trial(
        self,
        registry: Registry,
        plan: _runner.Plan,
        trial: _runner.TrialRun,
        relaunch: bool = False,
    ) -> int:
        """Run one recorded trial to its end; its exit code (0: completed or stopped)."""


class LocalLauncher(Launcher):
    """The trial runs on this machine, as `run` always ran it (`_experiments.run_trial`)."""

    name = "local"

    def run_trial(
        self,
        registry: Registry,
        plan: _runner.Plan,
        trial: _runner.TrialRun,
        relaunch: bool = False,
    ) -> int:
        return _experiments.run_trial(registry, plan, trial, relaunch)
