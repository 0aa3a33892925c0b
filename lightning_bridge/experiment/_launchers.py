"""The launchers by name, as `--launcher` and an experiment's record name them."""

from __future__ import annotations

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment._launcher import Launcher, LocalLauncher

LAUNCHERS = ("local", "slurm")


def launcher_for(name: str | None) -> Launcher:
    """The launcher named on the command line or in an experiment's record."""
    if name in (None, "", "local"):
        return LocalLauncher()
    if name == "slurm":
        from lightning_bridge.experiment._slurm import SlurmLauncher

        return SlurmLauncher()
    raise InvalidArgumentError(
        f"--launcher {name}: unknown launcher; choose one of {', '.join(LAUNCHERS)}."
    )
