"""The run's processes against the machine, before anything is launched.

The number of processes (`resources.slots_per_trial` or `--devices N`) is compared with the
devices of the accelerator the run's checked `EngineSettings` pick (`Plan.check_engine`): more
than its GPUs cannot run; more than its CPU cores runs oversubscribed, slower, which the
command asks about. A search's trials on this machine: as many at once as whole sets of the
machine's GPUs (or CPU cores) hold (`trials_at_once`, the local launcher's capacity).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys

from lightning_bridge.experiment.config._plan import Plan

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


def visible_gpus() -> list[str]:
    """The GPUs trials may use: `CUDA_VISIBLE_DEVICES` when set, else those `nvidia-smi`
    lists (none on a machine without it). Torch is not imported for this."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    return [str(i) for i in range(len(lines))] if listed.returncode == 0 else []


def trials_at_once(
    accelerator: str | None, devices: object, processes: int
) -> tuple[int, list[str]]:
    """How many trials of `processes` processes fit on this machine at once, and the GPUs
    they share out: whole sets of `processes` GPUs (each trial gets its own), else of CPU
    cores (in a Slurm allocation, a worker job or `salloc`: its cores on this node, not the
    node's); at least one. Devices named explicitly (`--devices 0,1`): one, every trial would
    use the same ones."""
    gpus = [] if (accelerator or "auto").lower() == "cpu" else visible_gpus()
    if isinstance(devices, str):
        return 1, []
    if gpus:
        return max(len(gpus) // processes, 1), gpus
    cores = int(os.environ.get("SLURM_CPUS_ON_NODE", "0") or 0) or os.cpu_count() or 1
    return max(cores // processes, 1), []
