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
from lightning_bridge.translation._settings import ENGINE_KEYS
from lightning_bridge.translation._trainer import _ENGINE_WARNINGS, _check_launcher


def _several(devices: Any, num_nodes: int) -> bool:
    """Whether these settings may train more than one process (Fabric knows for sure)."""
    if num_nodes > 1:
        return True
    if devices is None or devices == 1 or devices == "1":
        return False
    return not (isinstance(devices, (list, tuple)) and len(devices) == 1)


def launch_processes(
    *,
    accelerator: Any,
    devices: Any,
    num_nodes: int,
    strategy: Any,
    trainer_kwargs: dict[str, Any] | None,
) -> bool:
    """Start every process of a multi-process run and create its process group; True when
    this call did (nothing to do for one process, or a process group that already exists)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    settings: dict[str, Any] = {
        "accelerator": accelerator,
        "devices": devices if devices is not None else 1,
        "num_nodes": num_nodes,
        "strategy": strategy,
    }
    # The engine keys of `trainer_kwargs` win at the fit (see `fit_settings`): here too.
    extra = trainer_kwargs or {}
    settings.update({k: extra[k] for k in ENGINE_KEYS if k in extra and k != "precision"})
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
    _check_launcher(fabric)
    with warnings.catch_warnings():
        for pattern in _ENGINE_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        fabric.launch()
    return True
