"""Checkpoint retention as Determined's `checkpoint_storage` config names it.

`save_trial_latest` keeps the newest N checkpoints, `save_trial_best` and
`save_experiment_best` keep the N best by the searcher metric (one trial is the whole
experiment here, so the larger of the two applies); everything else is deleted once a newer
checkpoint is complete. The newest checkpoint is always kept: it is what a run continues from.

Each checkpoint records the ones kept before it (`history`), so a run continued from it
(`resume`) applies the policy to those too, not only to the checkpoints it writes itself.

A checkpoint is named by its local path (its name is its uuid); `remove` deletes it wherever it
is stored (a local folder by default).
"""

from __future__ import annotations

import logging
import pathlib
import shutil
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("lightning_bridge")


class CheckpointRetention:
    """Tracks written checkpoints and deletes those the policy no longer keeps."""

    def __init__(
        self,
        keep_latest: int,
        keep_best: int,
        smaller_is_better: bool,
        remove: Callable[[pathlib.Path], None] | None = None,
    ) -> None:
        self._remove = remove or (lambda p: shutil.rmtree(p, ignore_errors=True))
        self._keep_latest = keep_latest
        self._keep_best = keep_best
        self._smaller_is_better = smaller_is_better
        self._written: list[tuple[pathlib.Path, float | None]] = []

    @classmethod
    def from_section(
        cls,
        storage: Mapping[str, Any] | None,
        smaller_is_better: bool = True,
        remove: Callable[[pathlib.Path], None] | None = None,
    ) -> CheckpointRetention | None:
        """The policy of a config's `checkpoint_storage` section (`smaller_is_better`: the
        searcher metric's direction); None (keep everything) when there is no section."""
        if storage is None:
            return None
        return cls(
            keep_latest=int(storage.get("save_trial_latest", 1)),
            keep_best=max(
                int(storage.get("save_trial_best", 1)),
                int(storage.get("save_experiment_best", 0)),
            ),
            smaller_is_better=smaller_is_better,
            remove=remove,
        )

    def history(self) -> list[list[Any]]:
        """The checkpoints kept so far, `[directory name, searcher metric or None]` in the
        order written: what a checkpoint records for a run continued from it."""
        return [[p.name, m] for p, m in self._written]

    def resume(self, checkpoint: pathlib.Path, recorded: Any, metric: float | None) -> None:
        """Continue the record of the run that wrote `checkpoint`: the checkpoints its
        `history` names that still exist beside it, then `checkpoint` itself."""
        written: list[tuple[pathlib.Path, float | None]] = []
        for entry in recorded if isinstance(recorded, list) else []:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                continue
            name, value = entry
            path = checkpoint.parent / name
            if "/" not in name and name != checkpoint.name and path.is_dir():
                written.append((path, float(value) if isinstance(value, (int, float)) else None))
        self._written = [*written, (checkpoint, metric)]

    def track(self, path: pathlib.Path, metric: float | None) -> None:
        """Note a checkpoint an earlier run of the trial kept (oldest first), without pruning."""
        self._written.append((path, metric))

    def record(self, path: pathlib.Path, metric: float | None) -> list[pathlib.Path]:
        """Note a complete checkpoint (with its searcher metric, if validated); prune."""
        self._written.append((path, metric))
        keep = {self._written[-1][0]}
        keep.update(p for p, _ in self._written[-self._keep_latest :] if self._keep_latest > 0)
        scored = [(m, i, p) for i, (p, m) in enumerate(self._written) if m is not None]
        scored.sort(key=lambda t: (t[0] if self._smaller_is_better else -t[0], t[1]))
        keep.update(p for _, _, p in scored[: self._keep_best])
        removed = [p for p, _ in self._written if p not in keep]
        for p in removed:
            self._remove(p)
            logger.info("Removed checkpoint %s (checkpoint_storage retention)", p.name)
        self._written = [(p, m) for p, m in self._written if p in keep]
        return removed
