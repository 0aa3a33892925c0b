"""`ConfigValues`: the values of an experiment config that a fit reads, typed, read once.

A trial's experiment config reaches its context as the dict Determined's API hands the trial
(`context.get_experiment_config()`, `init(exp_conf=...)`, a checkpoint's recorded config).
The fit reads a few of its values: the searcher metric and its direction (checkpoint policy,
retention, the run's record), the `checkpoint_storage` section (where checkpoints go, what is
kept), and the experiment seed. They are read from the dict here, once per context, so the
fit's modules read named, typed fields instead of the dict's keys.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ConfigValues:
    """What a fit reads of its experiment config (the defaults: no config given).

    `checkpoint_storage` is the config's section as given (None when absent): the checkpoint
    storage and the retention policy are built from it where they are made.
    """

    searcher_metric: str | None = None
    smaller_is_better: bool = True
    checkpoint_storage: Mapping[str, Any] | None = None
    experiment_seed: Any = None

    @classmethod
    def of(cls, exp_conf: Mapping[str, Any] | None) -> ConfigValues:
        """The values of `exp_conf` (a config dict, or None)."""
        conf = exp_conf or {}
        searcher = conf.get("searcher") or {}
        storage = conf.get("checkpoint_storage")
        return cls(
            searcher_metric=searcher.get("metric"),
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            checkpoint_storage=storage if isinstance(storage, Mapping) else None,
            experiment_seed=(conf.get("reproducibility") or {}).get("experiment_seed"),
        )

    @property
    def checkpoint_host_dir(self) -> pathlib.Path | None:
        """The folder a `shared_fs` section's `host_path` / `storage_path` name, if any."""
        storage = self.checkpoint_storage or {}
        if not storage.get("host_path"):
            return None
        return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")
