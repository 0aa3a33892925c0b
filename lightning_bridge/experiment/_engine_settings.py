"""The run command's engine settings, checked before anything is built or launched.

`--accelerator`, `--devices`, `--strategy` and `--precision` are checked against what Lightning
accepts (`translation._engine_check`, imported here only when a run gets that far, so commands
that fail earlier load no Lightning). The number of processes (`resources.slots_per_trial` or
`--devices N`) is compared with the machine: more than its GPUs cannot run; more than its CPU
cores runs oversubscribed, slower, which the command asks about.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Oversubscription:
    """More processes than the machine runs side by side: `allowed` for CPU cores (slower, on
    confirmation), never for devices."""

    message: str
    allowed: bool


def check_settings(plan: Any) -> None:
    """Check the command line's engine settings (InvalidArgumentError listing the accepted
    values); remember the accelerator Lightning will use on the plan."""
    from lightning_bridge.translation._engine_check import check_engine

    options = plan.options
    plan.accelerator = check_engine(
        accelerator=options.accelerator or "auto",
        devices=options.devices,
        strategy=options.strategy,
        precision=options.precision,
        spell=lambda name: f"--{name}",
    )


def oversubscription(plan: Any) -> Oversubscription | None:
    """Whether the run's processes outnumber the devices (or CPU cores) of this machine."""
    from lightning_bridge.translation._engine_check import capacity

    count, kind = capacity(plan.accelerator)
    wanted = plan.processes
    if wanted <= count:
        return None
    source = "--devices" if isinstance(plan.options.devices, int) else "resources.slots_per_trial"
    message = (
        f"{source} asks for {wanted} processes, but this machine has {count} {kind}"
        f"{'s' if count != 1 else ''}"
    )
    return Oversubscription(message, allowed=kind == "CPU core")
