"""The local launcher: trials on this machine, as `run` always ran them (a search's forked
from a warm process, `_warm`), and the handle of a recorded trial whose process runs here."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Sequence

from lightning_bridge._process import pid_alive
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.launch._contract import Launcher, RunningTrial
from lightning_bridge.experiment.launch._handle import TrialProcess
from lightning_bridge.experiment.launch._warm import WarmStarter
from lightning_bridge.experiment.trial_process import _execute, _run
from lightning_bridge.experiment.trial_process._parent import PARENT_ENV
from lightning_bridge.experiment.trials import _workdir
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.translation.services._run_description import ENV_VAR


class ProcessOnThisMachine(RunningTrial):
    """A trial's process on this machine (`pid`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.key = f"process {pid}"

    def describe(self) -> str:
        return f"{self.key} on {socket.gethostname()}, running"

    def stop(self, registry: Registry, trial_id: int, kill: bool, signal_it: bool) -> str:
        if signal_it:
            os.kill(self.pid, signal.SIGKILL if kill else signal.SIGTERM)
        return self.key


class LocalLauncher(Launcher):
    """The trial runs on this machine, as `run` always ran it (`_run.run_trial`); a
    search's trial in a process of its own, forked from a warm process where it is safe
    (`_warm.WarmStarter`), else started cold."""

    name = "local"

    def __init__(self) -> None:
        self._starter: WarmStarter | None = None

    @property
    def starter(self) -> WarmStarter:
        if self._starter is None:
            self._starter = WarmStarter()
        return self._starter

    def warm_up(self, preload: Sequence[str]) -> None:
        self._starter = WarmStarter(preload)
        self._starter.warm_up()

    def ready(self) -> bool:
        return self._starter is None or self._starter.ready()

    def close(self) -> None:
        if self._starter is not None:
            self._starter.close()

    def start(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        devices: Sequence[str] = (),
    ) -> TrialProcess:
        """The trial's process (`lightning-bridge _trial RUN_FILE`) in its own copy of the
        folder, its output in the trial's `output.log`, ended with the process that started
        it (`PARENT_ENV`)."""
        trial.trial_dir.mkdir(parents=True, exist_ok=True)
        _execute.describe_run(plan, trial).write(trial.run_file)
        _workdir.prepare_work_dir(plan, trial)  # the trial's process starts in its copy
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        env[PARENT_ENV] = str(os.getpid())
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        command = [sys.executable, "-m", "lightning_bridge", "_trial", str(trial.run_file)]
        output = str(trial.trial_dir / "output.log")
        return self.starter.start(command, cwd=trial.working_dir(plan), env=env, output=output)

    def running(self, trial: Trial, job: Job | None) -> RunningTrial | None:
        """The trial's process, alive on this machine, as recorded."""
        if trial.state != TrialState.ACTIVE.value or trial.pid is None:
            return None
        if trial.host != socket.gethostname() or not pid_alive(trial.pid):
            return None
        return ProcessOnThisMachine(trial.pid)

    def capacity(self, plan: _plan.Plan, processes: int) -> tuple[int, list[str]]:
        """Whole sets of `processes` GPUs of this machine, else of its CPU cores."""
        from lightning_bridge.experiment.launch.local._machine_capacity import trials_at_once

        return trials_at_once(plan.options.accelerator, plan.options.devices, processes)

    def allows(self, plan: _plan.Plan, force: bool) -> bool:
        """More processes than this machine runs side by side: refused for devices, asked
        about (or `force`) for CPU cores (`_machine_capacity`)."""
        from lightning_bridge.experiment.launch.local._machine_capacity import (
            oversubscription_allowed,
        )

        return oversubscription_allowed(plan, force)

    def run_trial(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        relaunch: bool = False,
    ) -> int:
        return _run.run_trial(registry, plan, trial, relaunch)
