"""The run command's engine settings, checked before anything is built or launched.

`--accelerator`, `--devices`, `--strategy` and `--precision` are checked against what Lightning
accepts (`translation._engine_check`, imported here only when a run gets that far, so commands
that fail earlier load no Lightning). The number of processes (`resources.slots_per_trial` or
`--devices N`) is compared with the machine: more than its GPUs cannot run; more than its CPU
cores runs oversubscribed, slower, which the command asks about.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

logger = logging.getLogger("lightning_bridge")


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


def oversubscription_allowed(plan: Any, force: bool) -> bool:
    """More processes than devices is refused; more than CPU cores runs (slower) with
    --force or when the user confirms at a terminal."""
    found = oversubscription(plan)
    if found is None:
        return True
    if not found.allowed:
        print(
            f"lightning-bridge: error: {found.message}; lower resources.slots_per_trial "
            "(or pass --devices N) to at most that.",
            file=sys.stderr,
        )
        return False
    if force:
        logger.warning("%s: running them oversubscribed (--force), slower.", found.message)
        return True
    if sys.stdin is not None and sys.stdin.isatty():
        try:
            answer = input(
                f"lightning-bridge: {found.message}; they will share the cores (slower). "
                "Run anyway? [y/N] "
            )
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return True
    print(
        f"lightning-bridge: error: {found.message}; lower resources.slots_per_trial (or pass "
        "--devices N), or pass --force to run them oversubscribed.",
        file=sys.stderr,
    )
    return False
