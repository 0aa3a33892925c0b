"""Which checkpoint a run starts from, and whether it continues it or starts a new run from it.

`--resume` continues a checkpoint (its directory, its id under the checkpoint directory, or
`latest`). Without it, the config's `searcher.source_checkpoint_uuid` (a checkpoint id or
directory) or `searcher.source_trial_id` (the newest checkpoint that trial wrote into the
checkpoint directory) starts a new trial from that checkpoint: Determined's warm start.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError
from lightning_bridge.checkpoint._layout import resolve_checkpoint
from lightning_bridge.checkpoint._safe_load import read_trial_state


@dataclasses.dataclass
class Start:
    """The checkpoint to load (None: from scratch) and `fit()`'s `warm_start` for it."""

    checkpoint: str | None = None
    warm_start: bool | None = None


def _steps(path: pathlib.Path) -> int:
    try:
        return int(json.loads((path / "metadata.json").read_text())["steps_completed"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def _of_trial(ckpt_dir: pathlib.Path, trial_id: int) -> pathlib.Path | None:
    """The newest checkpoint under `ckpt_dir` written by trial `trial_id`."""
    found = []
    for path in ckpt_dir.iterdir() if ckpt_dir.is_dir() else []:
        if not path.is_dir() or path.name.startswith("."):
            continue
        try:
            state = read_trial_state(path)
        except InvalidCheckpointError:
            continue
        if state is not None and state.trial_id == trial_id:
            found.append(path)
    return max(found, key=lambda p: (_steps(p), p.stat().st_mtime)) if found else None


def starting_checkpoint(
    resume: str | None, ckpt_dir: pathlib.Path, searcher: dict[str, Any]
) -> Start:
    """See the module docstring; raises InvalidArgumentError naming the key that is wrong."""
    if resume is not None:
        found = resolve_checkpoint(resume, ckpt_dir, option="--resume")
        if not found.is_dir():
            raise InvalidArgumentError(
                f"--resume {resume}: no such checkpoint directory (nor a checkpoint id under "
                f"{ckpt_dir}); pass a checkpoint directory, its id, or 'latest'."
            )
        return Start(str(found), None)
    uuid = searcher.get("source_checkpoint_uuid")
    if uuid is not None:
        found = resolve_checkpoint(str(uuid), ckpt_dir, option="searcher.source_checkpoint_uuid")
        if not found.is_dir():
            raise InvalidArgumentError(
                f"searcher.source_checkpoint_uuid: no checkpoint {uuid!r} under {ckpt_dir} (nor "
                "a directory of that name); name a checkpoint id of that folder or a path."
            )
        return Start(str(found), True)
    trial_id = searcher.get("source_trial_id")
    if trial_id is not None:
        newest = _of_trial(ckpt_dir, int(trial_id))
        if newest is None:
            raise InvalidArgumentError(
                f"searcher.source_trial_id: no checkpoint of trial {trial_id} under {ckpt_dir}; "
                "use searcher.source_checkpoint_uuid to name the checkpoint instead."
            )
        return Start(str(newest), True)
    return Start()
