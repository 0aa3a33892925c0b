"""Hyperparameter search: Determined's searchers, run on an Optuna study.

The hyperparameter space of an experiment config (`_space`, `_grid`), its `searcher` section
(`_searchers`), the reference's search methods over a search's trials (`_methods`, `_asha`),
Determined's sampler and pruner (`_extensions`), and `SearchDriver`, which runs a search on an
Optuna study (a journal file, SQLite or PostgreSQL: `_storage`; its trials' attempts in it:
`_attempts`) through Optuna's ask / report / tell, so several processes can serve it and a
restarted one goes on: the workers that start trials and the trials' own processes, which
report to it (`_views` holds what they pass each other). `search_exists` says whether a storage
holds a search; `_storage_check` refuses a storage that is not one before anything is recorded.
Optuna is the `search` extra; nothing here imports it until a driver is made or a storage read.

This package is the searcher, what decides: which trials, which stop, which rung. Running a
search's trials (its worker, its Slurm worker jobs, a search to serve) is the experiment
layer's, `lightning_bridge.experiment.searches`; its commands are `experiment.cli`'s.
"""

from lightning_bridge.search._driver import SearchDriver
from lightning_bridge.search._grid import grid_points, missing_counts
from lightning_bridge.search._searchers import (
    REMOVED,
    SEARCHER,
    SEARCHER_NAMES,
    MaxLength,
    OneUnit,
    SearcherConfig,
)
from lightning_bridge.search._space import (
    HP_FORM,
    HP_TYPES,
    Space,
    is_constant,
    parse_space,
    trial_draw,
)
from lightning_bridge.search._storage import search_exists
from lightning_bridge.search._views import Decision, SearchSpec, TrialSpec, TrialView

__all__ = [
    "HP_FORM",
    "HP_TYPES",
    "REMOVED",
    "SEARCHER",
    "SEARCHER_NAMES",
    "Decision",
    "MaxLength",
    "OneUnit",
    "SearchDriver",
    "SearchSpec",
    "SearcherConfig",
    "Space",
    "TrialSpec",
    "TrialView",
    "grid_points",
    "is_constant",
    "missing_counts",
    "parse_space",
    "search_exists",
    "trial_draw",
]
