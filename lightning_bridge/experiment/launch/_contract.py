"""Where a trial runs: the launcher contract, in three parts (DESIGN.md, "Where trials run").

- The **launcher** (`Launcher`) checks before anything is recorded or submitted what it needs
  (`check_early`, `check`, `check_worker_jobs`, `check_record`: SQLite on a network file
  system is warned about on one machine, refused for trials on several) and whether the run
  may go on here (`allows`); it starts a trial (`start`), returning its handle, and runs a
  single trial to its end (`run_trial`, which records how it ended either way: by default
  `start`, then the handle followed to its end, `_handle.follow`).
- The **handle** answers for a started trial (`_handle.TrialProcess`: pid, wait, signal, and
  how a single trial's run follows, stops and settles it), and for a recorded trial that runs
  now (`running` -> `RunningTrial`: what `experiment pause | kill | describe` reach), so
  nothing outside the launchers branches on where a trial runs.
- The **environment** inside the trial's processes (`translation._trial_environment`)
  answers the launcher's questions there: requeued, restarts, node addresses, the signal
  that means "time is short", and whether the trial keeps its search trial.

`run --launcher NAME` picks one (`_registry.launcher_for`, the registry of names); the
experiment's record keeps the name (in its options), so `experiment continue` starts its
trials the same way. This module holds only the contract (and `sqlite_on_network`, the
record check every launcher makes); the launchers implement it: `local` (`local/_launcher.py`)
runs a single trial in this process and a search's trials as processes on this machine
(forked from a warm process, `_warm.py`); `slurm` (`slurm/_launcher.py`) submits each trial
as an `sbatch` job, or a search's trials into worker jobs (`searches/_slurm_workers.py`);
`ray` (`ray/_launcher.py`) places each trial on a Ray cluster (`ray/_placement.py`; a
search's forked from a warm process on its node).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import ClassVar

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.launch._handle import TrialProcess, follow
from lightning_bridge.record._filesystem import network_filesystem
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
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


class RunningTrial(abc.ABC):
    """A recorded trial that runs now, as `experiment pause | kill` reaches it: the handle
    its launcher gives for it from the record (`Launcher.running`)."""

    # What runs it: signalled once however many of the experiment's trials it runs (a
    # search's worker job runs several).
    key: str

    @abc.abstractmethod
    def stop(self, registry: Registry, trial_id: int, kill: bool, signal_it: bool) -> str:
        """Pause the trial (it checkpoints and stops) or `kill` it, signalling what runs it
        when `signal_it` (not yet signalled); where it runs, for the command's line."""

    def wait_stopped(self) -> None:  # noqa: B027 - a process is gone once killed
        """After a kill: until what ran it has ended (the trial's own last words first)."""

    def describe(self) -> str:
        """Where the trial runs and in which state, as what runs it says now (`experiment
        describe`'s line for a running trial)."""
        return f"{self.key}, running"


class Launcher(abc.ABC):
    """Starts a trial where it runs and reports its end (Lightning's strategies' style)."""

    name: ClassVar[str]
    several_machines: ClassVar[bool] = False  # whether trials run on other machines
    # Whether a scheduler places the trials (no machine capacity of this one bounds them).
    scheduler_places: ClassVar[bool] = False
    # Config keys this launcher reads besides those every run reads (not reported unused).
    config_keys: ClassVar[tuple[str, ...]] = ()

    def capacity(self, plan: _plan.Plan, processes: int) -> tuple[int, list[str]]:
        """How many of a search's trials (of `processes` processes each, planned as `plan`)
        this launcher runs at once from one worker, and the GPUs it shares out among them
        (`start`'s `devices`); a launcher whose scheduler places trials: as many as the
        searcher allows."""
        return 1 << 16, []

    def allows(self, plan: _plan.Plan, force: bool) -> bool:
        """Whether the run may go on as planned on the machine it lands on (`force`: the
        user accepted a slower run); a launcher whose scheduler places trials: always."""
        return True

    def check_worker_jobs(self, plan: _plan.Plan, count: int | None) -> None:
        """Refuse `--worker-jobs` (`count`) where it cannot apply, before anything is
        recorded: only a launcher with worker jobs takes it."""
        if count is None:
            return
        raise InvalidArgumentError(
            "--worker-jobs runs a search's trials in Slurm jobs; add --launcher slurm (on this "
            "machine a search already starts its trials from one warm process)"
        )

    def check_early(self, plan: _plan.Plan) -> None:  # noqa: B027 - most launchers need nothing
        """Refuse what this launcher can tell without Lightning (its config section, a
        cluster that does not answer or cannot place the trial), before the engine settings
        are checked against Lightning: such a refusal comes in seconds, with no torch
        loaded."""

    def check(self, plan: _plan.Plan) -> None:  # noqa: B027 - most launchers need nothing
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

    def running(self, trial: Trial, job: Job | None) -> RunningTrial | None:
        """The recorded trial's handle while it runs where this launcher put it (`job`: its
        recorded job, if any); None when it does not run there now."""
        return None

    def unreachable(self, registry: Registry, trial_id: int) -> str | None:
        """Why a trial that ended could not reach the services trials report to, from where it
        ran (then a search stops starting trials); None when that was not its end."""
        return None

    @abc.abstractmethod
    def start(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        devices: Sequence[str] = (),
    ) -> TrialProcess:
        """Start a search's recorded trial and return at once, its handle (the search's
        worker follows it); `devices`: the GPUs it gets on this machine (a launcher whose
        scheduler places trials gets none)."""

    def warm_up(self, preload: Sequence[str]) -> None:  # noqa: B027 - nothing to warm
        """Get ready to start a search's trials quickly (`preload`: what their processes
        import), from now until `close`."""

    def ready(self) -> bool:
        """Whether a trial started now starts at once (see `_warm.WarmStarter.ready`)."""
        return True

    def close(self) -> None:  # noqa: B027 - nothing to end
        """End what `warm_up` started."""

    def run_trial(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        relaunch: bool = False,
    ) -> int:
        """Run one recorded trial to its end; its exit code (0: completed or stopped).

        The contract's one way: `start` it, then follow its handle to its end (`_handle.follow`:
        the command's first stop signal pauses it, a second kills it; its end settled in the
        record). A start refused (InvalidArgumentError) ends the trial in ERROR with the
        refusal, raised on. A launcher that runs the trial in this very process (local)
        overrides it."""
        try:
            handle = self.start(registry, plan, trial)
        except InvalidArgumentError as exc:
            registry.trial_ended(trial.trial_id, TrialState.ERROR, str(exc), if_active=True)
            raise
        return follow(registry, trial.trial_id, handle)
