"""What a search says about itself: its spec, a trial to train, a decision, a trial's view.

Plain values (no Optuna): a worker hands a `TrialSpec` to the trial's own process in its run
description, and the process gives it back with each report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lightning_bridge.search._searchers import SEARCHER, SearcherConfig


@dataclass(frozen=True)
class SearchSpec:
    """What a search searches: its searcher, its `hyperparameters` section, its seed."""

    searcher: SearcherConfig
    hyperparameters: dict[str, Any]
    experiment_seed: int | None = None

    def to_json(self, seed: int) -> dict[str, Any]:
        return {
            "searcher": self.searcher.model_dump(mode="json", exclude_none=True),
            "hyperparameters": self.hyperparameters,
            "experiment_seed": seed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchSpec:
        return cls(
            SEARCHER.validate_python(data["searcher"]),
            data["hyperparameters"],
            data["experiment_seed"],
        )


@dataclass(frozen=True)
class TrialSpec:
    """A trial to train: `number` is its creation index in the search (0, 1, ...)."""

    number: int
    hparams: dict[str, Any]
    seed: int
    bracket: int
    # ASHA: the lengths (in `unit`) at which the trial is ranked; the last is max_length.
    rungs: tuple[int, ...]
    unit: str | None
    # Given back before (Ctrl-C, a lost worker): continue from its latest checkpoint.
    resumed: bool
    # What workers noted on the trial (`SearchDriver.note`), e.g. where they recorded it.
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The Optuna trial of this pull (each attempt at training the trial is one); a process
    # holding an older pull (its trial was given back meanwhile) can no longer report, close
    # or give it back. None: not from a pull (whatever attempt is running).
    attempt: int | None = None


@dataclass(frozen=True)
class Decision:
    """The searcher's answer to a reported metric: stop the trial now, or train on (to the
    next rung length when there is one)."""

    stop: bool
    next_rung: int | None = None


@dataclass(frozen=True)
class TrialView:
    """A trial as the search records it (for listings and tests)."""

    number: int
    state: str  # waiting, running, completed, stopped, errored, invalid_hp
    hparams: dict[str, Any]
    seed: int
    bracket: int
    rungs: dict[int, list[float]]
    metrics: dict[int, float]  # reported metric by length
    # Each report as the search took it: (length, metric, stop, time); not compared (two
    # searches that decide alike differ in when).
    reports: list[tuple[int, float, bool, float]] = dataclasses.field(
        default_factory=list, compare=False
    )
