"""The launchers by name, as `--launcher`, a workspace's settings and an experiment's record
name them."""

from __future__ import annotations

import pathlib

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.launch import LAUNCHERS
from lightning_bridge.experiment.launch._contract import Launcher, RunningTrial
from lightning_bridge.experiment.launch.local._launcher import LocalLauncher
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._settings import SETTINGS_FILE, WorkspaceSettings


def launcher_for(name: str | None, source: str = "--launcher") -> Launcher:
    """The launcher named on the command line or in an experiment's record (`source` says
    where the name came from, for the message refusing an unknown one)."""
    if name in (None, "", "local"):
        return LocalLauncher()
    if name == "slurm":
        from lightning_bridge.experiment.launch.slurm._launcher import SlurmLauncher

        return SlurmLauncher()
    if name == "ray":
        from lightning_bridge.experiment.launch.ray._launcher import RayLauncher

        return RayLauncher()
    raise InvalidArgumentError(
        f"{source} {name}: unknown launcher; choose one of {', '.join(LAUNCHERS)}."
    )


def default_launcher(workspace: pathlib.Path) -> str:
    """The launcher `run` uses when its command line names none: the workspace's `launcher`
    setting (`<workspace>/workspace.json`), else local."""
    name = WorkspaceSettings.read(workspace).launcher
    if name is None:
        return "local"
    launcher_for(name, f"{workspace / SETTINGS_FILE}: launcher")  # an unknown name refused
    return name


def running_trial(trial: Trial, job: Job | None) -> RunningTrial | None:
    """A recorded trial's handle while it runs: where its recorded job's launcher put it,
    else its process on this machine; None when it runs nowhere now."""
    if job is not None:
        found = launcher_for(job.launcher, "the record's job launcher").running(trial, job)
        if found is not None:
            return found
    return LocalLauncher().running(trial, None)
