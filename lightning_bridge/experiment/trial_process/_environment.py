"""The config's `environment.environment_variables`, applied to the trial's processes.

Every launcher (local, warm forks, Slurm tasks, Ray nodes) starts a trial through `execute()`,
so the variables are applied there, in the trial's own process, and every process it starts
(a script, torchrun's workers, Lightning's launcher's ranks) inherits them. Nothing carries
them on a command line. The order is Determined's: the environment the trial's process was
started with, then the config's variables (a name given twice takes its later value), then
what the startup hook exports, then what the launcher sets for each process (ranks, the
rendezvous; the config cannot name those).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from lightning_bridge.experiment.config._config_schema import DEVICE_TYPES, Environment


def device_type(environment: Environment, accelerator: str | None) -> str:
    """Which of Determined's device types (cpu, cuda, rocm) the trial's variables are chosen
    for: cpu unless the trial runs on a GPU, which `accelerator` (the command line's; "auto"
    when not given) asks for or, for "auto", the machine has. torch is asked only where the
    config gives the device types different variables."""
    lists = environment.environment_variables
    if all(lists[kind] == lists["cpu"] for kind in DEVICE_TYPES):
        return "cpu"
    wanted = (accelerator or "auto").lower()
    if wanted not in ("auto", "gpu", "cuda"):
        return "cpu"
    import torch

    if wanted == "auto" and not torch.cuda.is_available():
        return "cpu"
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def trial_variables(environment: Environment, accelerator: str | None) -> dict[str, str]:
    """The variables the config gives a trial on `accelerator` (see `device_type`)."""
    return environment.variables_for(device_type(environment, accelerator))


@contextmanager
def configured_environment(variables: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with `variables` set for the duration, restored after."""
    if not variables:
        yield
        return
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
