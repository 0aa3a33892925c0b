"""Start a trial's processes before the trial is built, as Determined does.

Determined creates the distributed context (every process started, the process group
initialised) before the trial class is constructed, so `__init__` may read
`context.distributed.get_rank()` / `get_size()` (per-rank data folders, a per-slot batch size).
`init()` does the same here: when the engine settings ask for several processes that are not
running yet, Lightning's launcher starts them now (re-running the command in each) and the
strategy creates the process group. The fit's own Fabric later finds them running and starts
nothing more.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import lightning as L
import torch.distributed

from lightning_bridge import _logging
from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.translation._engine_settings import EngineSettings
from lightning_bridge.translation._lightning_private import (
    is_multiprocessing_launcher,
    start_method,
)

# Lightning warnings about choices the bridge makes on the user's behalf. They say nothing
# actionable to a trial's author, so fits run without them.
ENGINE_WARNINGS = (
    # Lightning 2.6 on recent torch: its own use of a deprecated torch pytree API.
    r".*isinstance\(treespec, LeafSpec\).*",
)


def check_launcher(fabric: L.Fabric) -> None:
    """Processes started by multiprocessing (`ddp_spawn`, `ddp_fork`, `ddp_notebook`) would
    each train a copy of the trial, leaving the caller's untrained: refuse them."""
    launcher = getattr(fabric.strategy, "launcher", None)
    if launcher is not None and is_multiprocessing_launcher(launcher):
        raise InvalidArgumentError(
            f"strategy {type(fabric.strategy).__name__} with start method "
            f"{start_method(launcher)!r} starts processes that would each train "
            "a copy of the trial; use strategy='ddp' (each process runs the script, as "
            "Determined's launcher does) or launch the script with torchrun."
        )


def _several(devices: Any, num_nodes: int) -> bool:
    """Whether these settings may train more than one process (Fabric knows for sure)."""
    if num_nodes > 1:
        return True
    if devices is None or devices == 1 or devices == "1":
        return False
    return not (isinstance(devices, (list, tuple)) and len(devices) == 1)


def launch_processes(engine: EngineSettings) -> bool:
    """Start every process of a multi-process run and create its process group; True when
    this call did (nothing to do for one process, or a process group that already exists)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    settings = engine.fabric_kwargs()
    settings.pop("precision", None)
    if not _several(settings["devices"], settings["num_nodes"]):
        return False
    # Lightning configures a strategy or plugin object in place; the fit's Fabric gets the
    # caller's own, untouched.
    for key in ("strategy", "plugins"):
        if key in settings and not isinstance(settings[key], str):
            settings[key] = copy.deepcopy(settings[key])
    _logging.adopt_lightning()
    fabric = L.Fabric(**settings)
    if fabric.world_size < 2:
        return False
    check_launcher(fabric)
    with warnings.catch_warnings():
        for pattern in ENGINE_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        fabric.launch()
    return True
