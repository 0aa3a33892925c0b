"""`ConfigValues`: what a fit reads of its experiment config, read once into named fields.

The experiment config reaches a trial's context as the dict Determined's API hands the trial
(`get_experiment_config()`). The few values the fit reads of it (the searcher metric and its
direction, the `checkpoint_storage` section, the experiment seed, ...) are read once, when the
context is built, so the fit's modules read named, typed fields instead of the dict's keys.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ConfigValues:
    """What a fit reads of its experiment config, read once (the defaults: no config given).

    `checkpoint_storage` is the config's section as given (None when absent): the checkpoint
    storage and the retention policy are built from it where they are made. `max_length`
    (the searcher's), `min_validation_period` and `global_batch_size` (the hyperparameters')
    are as given too: the fit reading them parses them into its own units.
    """

    searcher_metric: str | None = None
    smaller_is_better: bool = True
    checkpoint_storage: Mapping[str, Any] | None = None
    experiment_seed: Any = None
    aggregation_frequency: Any = 1
    max_length: Any = None
    min_validation_period: Any = None
    global_batch_size: Any = None

    @classmethod
    def of(cls, exp_conf: Mapping[str, Any] | None) -> ConfigValues:
        """The values of `exp_conf` (a config dict, or None); a section that is not a mapping
        (a config only loaded, never validated: a checkpoint's) reads as absent."""
        conf = exp_conf or {}

        def section(key: str) -> Mapping[str, Any]:
            value = conf.get(key)
            return value if isinstance(value, Mapping) else {}

        searcher = section("searcher")
        storage = conf.get("checkpoint_storage")
        return cls(
            searcher_metric=searcher.get("metric"),
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            checkpoint_storage=storage if isinstance(storage, Mapping) else None,
            experiment_seed=section("reproducibility").get("experiment_seed"),
            aggregation_frequency=section("optimizations").get("aggregation_frequency", 1) or 1,
            max_length=searcher.get("max_length"),
            min_validation_period=conf.get("min_validation_period"),
            global_batch_size=section("hyperparameters").get("global_batch_size"),
        )

    @property
    def checkpoint_host_dir(self) -> pathlib.Path | None:
        """The folder a `shared_fs` section's `host_path` / `storage_path` name, if any."""
        storage = self.checkpoint_storage or {}
        if not storage.get("host_path"):
            return None
        return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")
