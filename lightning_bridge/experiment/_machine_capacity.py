"""The run's processes against the machine, before anything is launched.

The number of processes (`resources.slots_per_trial` or `--devices N`) is compared with the
devices of the accelerator the run's checked `EngineSettings` pick (`Plan.check_engine`): more
than its GPUs cannot run; more than its CPU cores runs oversubscribed, slower, which the
command asks about.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

from lightning_bridge.experiment._runner import Plan

logger = logging.getLogger("lightning_bridge")


@dataclasses.dataclass
class Oversubscription:
    """More processes than the machine runs side by side: `allowed` for CPU cores (slower, on
    confirmation), never for devices."""

    message: str
    allowed: bool


def oversubscription(plan: Plan) -> Oversubscription | None:
    """Whether the run's processes outnumber the devices (or CPU cores) of this machine."""
    from lightning_bridge.translation._engine_settings import capacity

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


def oversubscription_allowed(plan: Plan, force: bool) -> bool:
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
