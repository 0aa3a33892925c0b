"""Where a trial runs: a launcher starts a trial's processes and waits for its end.

`run --launcher NAME` picks one (`_launchers.launcher_for`); the experiment's record keeps the
name (in its options), so `experiment continue` starts its trials the same way. `local` runs
the trial on this machine as `run` always has; `slurm` submits each trial as an `sbatch` job
(`_slurm`). A launcher checks
what it needs before anything is recorded or submitted (`check`), then runs each trial to its
end (`run_trial`), which records how it ended either way. Every trial reports to the
workspace's record: SQLite on a network file system, whose locking SQLite cannot rely on, is
warned about (one machine) or refused (trials on several machines, `check_record`).
"""

from __future__ import annotations

import abc
import logging
from typing import ClassVar

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment import _experiments, _runner
from lightning_bridge.experiment._trial_process import TrialProcess
from lightning_bridge.record._filesystem import network_filesystem
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._settings import SETTINGS_FILE, WorkspaceSettings
from lightning_bridge.record._workspace import Workspace

logger = logging.getLogger("lightning_bridge")


def sqlite_on_network(workspace: Workspace, mounts: str | None = None) -> str | None:
    """Why the workspace's record cannot be trusted where it is (SQLite on a network file
    system) and the fix; None when it can. `mounts`: the mounts table (default: this
    machine's)."""
    if WorkspaceSettings.read(workspace.root).record is not None:
        return None  # a PostgreSQL server
    kind = network_filesystem(workspace.registry_path.parent, mounts)
    if kind is None:
        return None
    return (
        f"the experiment record {workspace.registry_path} is an SQLite database on a network "
        f"file system ({kind}), where SQLite's locking is unreliable: writes of several "
        "processes may be lost or corrupt the record. Keep the record on a PostgreSQL server: "
        f'write {{"record": "postgresql://USER:PASSWORD@HOST/DATABASE"}} in '
        f"{workspace.root / SETTINGS_FILE}, or choose a --workspace on a local disk"
    )


class Launcher(abc.ABC):
    """Starts a trial where it runs and reports its end (Lightning's strategies' style)."""

    name: ClassVar[str]
    several_machines: ClassVar[bool] = False  # whether trials run on other machines

    def check(self, plan: _runner.Plan) -> None:  # noqa: B027 - most launchers need nothing
        """Refuse a plan this launcher cannot run (InvalidArgumentError), before anything is
        recorded or submitted."""

    def check_record(self, workspace: Workspace, mounts: str | None = None) -> None:
        """Refuse a record trials on other machines cannot share safely (SQLite on a network
        file system), before anything is recorded; on one machine, warn."""
        reason = sqlite_on_network(workspace, mounts)
        if reason is None:
            return
        if self.several_machines:
            raise InvalidArgumentError(
                f"--launcher {self.name} runs trials on several machines, and {reason}."
            )
        logger.warning("%s.", reason[0].upper() + reason[1:])

    def unreachable(self, registry: Registry, trial_id: int) -> str | None:
        """Why a trial that ended could not reach the services trials report to, from where it
        ran (then a search stops starting trials); None when that was not its end."""
        return None

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
