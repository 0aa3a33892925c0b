"""Determined's search methods as decisions over the trials of a search.

A search's state is its trials (`Record`): the bracket each belongs to, why it was created,
whether it is still open, the metrics it put in each rung. Each event (a trial reported a
metric, closed, exited early) is a function of these records that updates the trial's own
record and says which trials to create (`Create`). Nothing else is kept, so a search stored
as its trials resumes exactly where it stopped, and creations keyed by their cause are never
made twice. The semantics are Determined 0.38's:

- `single` / `random`: `max_trials` trials, at most `max_concurrent_trials` (0: no limit) open
  at once, each closing trial making room for the next; a trial that raised InvalidHP does not
  count against `max_trials` for random (it is replaced), and does for single.
- `grid`: one trial per grid point, taken from the end of the grid, `max_concurrent_trials` at
  a time; an InvalidHP trial uses up its point.
- `async_halving` / `adaptive_asha`: brackets of rungs (`_asha`); a stopped trial, one that
  exited early and one that raised InvalidHP each start a new trial in their bracket (the
  first two while the bracket has fewer than its `max_trials` valid trials); an early exit
  counts as the worst metric in its rung, an InvalidHP trial's metrics leave every rung.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_bridge.search import _asha
from lightning_bridge.search._grid import grid_points
from lightning_bridge.search._searchers import (
    AdaptiveAshaSearcher,
    AsyncHalvingSearcher,
    GridSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
)
from lightning_bridge.search._space import Space


@dataclass
class Record:
    """One trial of a search, as the search method sees it."""

    number: int
    bracket: int = 0
    cause: str = ""
    open: bool = True
    invalid: bool = False
    # ASHA: the rung the trial is working towards (or was stopped in), its metrics per rung.
    rung: int = 0
    rungs: dict[int, list[float]] = field(default_factory=dict)
    stopped: bool = False


@dataclass(frozen=True)
class Create:
    """A trial to create: its bracket, why (unique within a search), its grid point if any."""

    bracket: int
    cause: str
    point: dict[str, Any] | None = None


def signed(metric: float, smaller_is_better: bool) -> float:
    """The metric as ASHA ranks it: smaller is better; NaN ranks last."""
    if math.isnan(metric):
        return _asha.EXITED_METRIC
    value = metric if smaller_is_better else -metric
    return max(min(value, _asha.EXITED_METRIC), -_asha.EXITED_METRIC)


class Method:
    """A search method: which trials to create, and whether a reporting trial stops."""

    def top_up(self, records: Sequence[Record]) -> list[Create]:
        """Trials to create now: the initial ones, or the room a closed trial left."""
        raise NotImplementedError

    def on_report(
        self, records: Sequence[Record], trial: Record, length: int, metric: float
    ) -> tuple[bool, list[Create]]:
        """`trial` reached `length` with (signed) `metric`: stop it? and trials to create."""
        return False, []

    def on_close(self, records: Sequence[Record], trial: Record) -> list[Create]:
        return self.top_up(records)

    def on_early_exit(
        self, records: Sequence[Record], trial: Record, invalid_hp: bool
    ) -> list[Create]:
        trial.invalid = invalid_hp
        return self.top_up(records)

    def rung_lengths(self, bracket: int) -> list[int]:
        return []


def _open(records: Sequence[Record]) -> int:
    return sum(r.open for r in records)


class RandomMethod(Method):
    def __init__(self, max_trials: int, max_concurrent: int, replace_invalid: bool) -> None:
        self.max_trials = max_trials
        self.max_concurrent = max_concurrent
        self.replace_invalid = replace_invalid

    def top_up(self, records: Sequence[Record]) -> list[Create]:
        counted = sum(not (r.invalid and self.replace_invalid) for r in records)
        room = self.max_trials - counted
        if self.max_concurrent > 0:
            room = min(room, self.max_concurrent - _open(records))
        return [Create(0, f"trial:{len(records) + i}") for i in range(max(room, 0))]


class GridMethod(Method):
    def __init__(self, points: list[dict[str, Any]], max_concurrent: int) -> None:
        self.points = points
        self.max_concurrent = max_concurrent

    def top_up(self, records: Sequence[Record]) -> list[Create]:
        room = len(self.points) - len(records)
        if self.max_concurrent > 0:
            room = min(room, self.max_concurrent - _open(records))
        # Determined takes the points from the end of the grid.
        return [
            Create(0, f"grid:{index}", self.points[len(self.points) - 1 - index])
            for index in range(len(records), len(records) + max(room, 0))
        ]


class AshaMethod(Method):
    def __init__(self, brackets: list[_asha.Bracket], divisor: float, max_length: int) -> None:
        self.brackets = brackets
        self.divisor = divisor
        self.rungs = [_asha.rung_lengths(b.num_rungs, divisor, max_length) for b in brackets]

    def rung_lengths(self, bracket: int) -> list[int]:
        return list(self.rungs[bracket])

    def top_up(self, records: Sequence[Record]) -> list[Create]:
        causes = {r.cause for r in records}
        return [
            Create(b, cause)
            for b, bracket in enumerate(self.brackets)
            for i in range(_asha.initial_trials(bracket, self.divisor))
            if (cause := f"initial:{b}:{i}") not in causes
        ]

    def on_close(self, records: Sequence[Record], trial: Record) -> list[Create]:
        return []

    def _replace(
        self, records: Sequence[Record], trial: Record, cause: str, always: bool = False
    ) -> list[Create]:
        if any(r.cause == cause for r in records):
            return []
        peers = [r for r in records if r.bracket == trial.bracket and not r.invalid]
        if always or len(peers) < self.brackets[trial.bracket].max_trials:
            return [Create(trial.bracket, cause)]
        return []

    def on_report(
        self, records: Sequence[Record], trial: Record, length: int, metric: float
    ) -> tuple[bool, list[Create]]:
        if trial.stopped:
            return True, []
        rungs = self.rungs[trial.bracket]
        peers = [r for r in records if r.bracket == trial.bracket and not r.invalid]
        for index in range(trial.rung, len(rungs)):
            trial.rung = index
            if length < rungs[index]:
                return False, []
            existing = [v for r in peers for v in r.rungs.get(index, [])]
            rank = _asha.insert_index(existing, metric)
            trial.rungs.setdefault(index, []).append(metric)
            top = index == len(rungs) - 1
            if top or not _asha.continues(rank, len(existing) + 1, self.divisor):
                trial.stopped = True
                return True, self._replace(records, trial, f"stop:{trial.number}")
        return False, []

    def on_early_exit(
        self, records: Sequence[Record], trial: Record, invalid_hp: bool
    ) -> list[Create]:
        if invalid_hp:
            trial.invalid = True
            return self._replace(records, trial, f"invalid:{trial.number}", always=True)
        trial.rungs.setdefault(trial.rung, []).append(_asha.EXITED_METRIC)
        return self._replace(records, trial, f"exit:{trial.number}")


def method_for(searcher: SearcherConfig, space: Space) -> Method:
    """The search method a validated searcher config describes."""
    if isinstance(searcher, SingleSearcher):
        return RandomMethod(1, 1, replace_invalid=False)
    if isinstance(searcher, RandomSearcher):
        return RandomMethod(
            searcher.max_trials, searcher.max_concurrent_trials, replace_invalid=True
        )
    if isinstance(searcher, GridSearcher):
        return GridMethod(grid_points(space), searcher.max_concurrent_trials)
    length = searcher.length()
    assert length is not None, "the halving searchers check their length"
    if isinstance(searcher, AsyncHalvingSearcher):
        brackets = [
            _asha.Bracket(searcher.num_rungs, searcher.max_trials, searcher.max_concurrent_trials)
        ]
    else:
        assert isinstance(searcher, AdaptiveAshaSearcher)
        brackets = _asha.adaptive_brackets(
            max_trials=searcher.max_trials,
            max_length=length[1],
            divisor=searcher.divisor,
            mode=searcher.mode,
            max_rungs=searcher.max_rungs,
            bracket_rungs=searcher.bracket_rungs,
            max_concurrent_trials=searcher.max_concurrent_trials,
        )
    return AshaMethod(brackets, searcher.divisor, length[1])
