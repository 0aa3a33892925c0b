"""ASHA arithmetic and simulated searches against Determined 0.38.1's own searcher tests.

Every expected value here is the one Determined's Go tests assert (master/pkg/searcher/*_test.go,
named in each test). The simulated searches report a synthetic metric, no training: they replay
the Go tests' `TestSearchRunner.run` (trials taken in creation order, a validation every
`period` units from 0 to `max_units`, the metric going up by one at each report) through
`SearchDriver` on a real Optuna journal file, and compare rung lengths, brackets, trial counts
and stop points with the reference's.
"""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Any

import pytest

from lightning_bridge.search import SEARCHER, SearchDriver, SearchSpec
from lightning_bridge.search._asha import (
    EXITED_METRIC,
    Bracket,
    adaptive_brackets,
    bracket_max_concurrent_trials,
    bracket_max_trials,
    continues,
    insert_index,
    rung_lengths,
)
from lightning_bridge.search._methods import AshaMethod, Record, signed

pytest.importorskip("optuna")


def test_bracket_max_trials() -> None:
    # adaptive_asha_test.go TestBracketMaxTrials.
    assert bracket_max_trials(20, 3.0, [3, 2, 1]) == [12, 5, 3]
    assert bracket_max_trials(50, 3.0, [4, 3]) == [35, 15]
    assert bracket_max_trials(50, 4.0, [3, 2]) == [37, 13]
    assert bracket_max_trials(100, 4.0, [4, 3, 2]) == [70, 22, 8]


def test_bracket_max_concurrent_trials() -> None:
    # adaptive_asha_test.go TestBracketMaxConcurrentTrials.
    assert bracket_max_concurrent_trials(0, 3.0, [9, 3, 1]) == [3, 3, 3]
    assert bracket_max_concurrent_trials(11, 3.0, [9, 3, 1]) == [4, 4, 3]
    assert bracket_max_concurrent_trials(0, 4.0, [40, 10]) == [10, 10]


def test_make_brackets() -> None:
    # adaptive_asha_test.go TestMakeBrackets (divisor defaults to 4, max_rungs to 5).
    standard = adaptive_brackets(
        max_trials=10,
        max_length=100,
        divisor=4.0,
        mode="standard",
        max_rungs=5,
        bracket_rungs=[],
        max_concurrent_trials=2,
    )
    assert standard == [Bracket(2, 7, 1), Bracket(1, 3, 1)]
    conservative = adaptive_brackets(
        max_trials=10,
        max_length=1000,
        divisor=3.0,
        mode="conservative",
        max_rungs=5,
        bracket_rungs=[],
        max_concurrent_trials=5,
    )
    assert conservative == [Bracket(3, 7, 2), Bracket(2, 2, 2), Bracket(1, 1, 1)]


def test_make_rungs() -> None:
    # asha_stopping_test.go TestMakeRungs.
    assert rung_lengths(3, 3.0, 9) == [1, 3, 9]
    assert rung_lengths(4, 2.0, 10) == [1, 2, 5, 10]
    assert rung_lengths(1, 3.0, 9) == [9]
    assert rung_lengths(3, 3.0, 900) == [100, 300, 900]


def test_insert_completed_metric() -> None:
    # asha_stopping_test.go TestInsertCompletedMetric.
    assert insert_index([0.0, 1.5, 2.1], 1.2) == 1
    assert insert_index([0.0, 1.5, 2.0], 3.0) == 3
    assert insert_index([-3.0, -2.0, -1.0], -3.4) == 0
    assert insert_index([], 1.2) == 0
    assert insert_index([1.0, 1.0], 1.0) == 0  # a tie ranks the newcomer first
    assert continues(0, 1, 3.0) and not continues(1, 2, 3.0) and continues(1, 8, 4.0)


def test_metric_sign() -> None:
    # asha_stopping_test.go TestGetMetric: smaller_is_better false negates the metric.
    assert signed(0.25, True) == 0.25 and signed(0.2, False) == -0.2
    # A NaN metric ranks last (as an exited trial does); infinities stay ordered.
    assert signed(float("nan"), True) == signed(float("nan"), False) == EXITED_METRIC
    assert signed(float("inf"), True) == EXITED_METRIC and signed(float("inf"), False) < -1e300


def test_stop_trials() -> None:
    # asha_stopping_test.go TestStopTrials: rungs [1, 3, 9], divisor 3, one rung at a time.
    method = AshaMethod([Bracket(3, 10, 3)], 3.0, 9)
    assert method.rung_lengths(0) == [1, 3, 9]
    one, two = Record(number=1), Record(number=2)
    # "first validation": rung 0 gets 0.5, the trial goes on towards rung 1.
    assert method.on_report([one, two], one, 1, 0.5) == (False, [])
    assert (one.rung, one.rungs) == (1, {0: [0.5]})
    # "second validation better than first": 0.4 ranks first of two, continues.
    better = Record(number=2)
    assert method.on_report([one, better], better, 1, 0.4) == (False, [])
    assert (better.rung, better.rungs) == (1, {0: [0.4]})
    # "second validation worse than first": 0.6 ranks second of two, stopped in rung 0.
    stop, creates = method.on_report([one, two], two, 1, 0.6)
    assert stop and two.stopped and (two.rung, two.rungs) == (0, {0: [0.6]})
    assert [c.cause for c in creates] == ["stop:2"]  # a stop starts a trial in its bracket


def _simulate(
    tmp_path: pathlib.Path,
    searcher: dict[str, Any],
    max_units: int,
    period: int,
    increasing: bool = True,
) -> tuple[SearchDriver, dict[int, int]]:
    """The Go tests' TestSearchRunner.run(max_units, period, increasing)."""
    spec = SearchSpec(
        SEARCHER.validate_python(searcher),
        {"x": {"type": "int", "minval": 0, "maxval": 10, "count": 3}},
        102932948,
    )
    driver = SearchDriver(str(tmp_path / "search.journal"), "sim", spec)
    metric, stopped_at = 0.0, {}
    while (trial := driver.next_trial()) is not None:
        for units in range(0, max_units + 1, period):
            metric += 1 if increasing else -1
            if driver.report(trial, units, metric).stop:
                stopped_at[trial.number] = units
                break
        driver.complete(trial)
    assert driver.is_finished()
    return driver, stopped_at


def test_async_halving_search(tmp_path: pathlib.Path) -> None:
    # asha_stopping_test.go TestASHAStoppingSearchMethod: 10 trials, rungs [100, 300, 900];
    # with ever worse metrics only the first trial reaches 900, the 9 others stop at 100.
    searcher = {
        "name": "async_halving",
        "metric": "val_loss",
        "num_rungs": 3,
        "divisor": 3.0,
        "max_time": 900,
        "time_metric": "batches",
        "max_concurrent_trials": 3,
        "max_trials": 10,
    }
    driver, stopped_at = _simulate(tmp_path, searcher, 900, 100)
    trials = driver.trials()
    assert len(trials) == 10
    assert Counter(stopped_at.values()) == {900: 1, 100: 9}
    assert driver.next_trial() is None
    first = trials[0]
    assert first.rungs == {0: [2.0], 1: [4.0], 2: [10.0]} and first.state == "completed"
    assert all(t.state == "stopped" for t in trials[1:])
    # The same search ranking by larger-is-better on ever smaller metrics stops the same way.
    flipped = {**searcher, "smaller_is_better": False}
    _, stopped_at = _simulate(tmp_path / "flipped", flipped, 900, 100, increasing=False)
    assert Counter(stopped_at.values()) == {900: 1, 100: 9}


def test_adaptive_asha_search(tmp_path: pathlib.Path) -> None:
    # tournament_test.go TestAdaptiveASHASearchMethod: 2 brackets with rungs [10, 30, 90] and
    # [30, 90]; 9 trials, 6 in the first bracket (5 stopped at 10, 1 at 90) and 3 in the
    # second (2 stopped at 30, 1 at 90).
    searcher = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_time": 90,
        "time_metric": "batches",
        "divisor": 3.0,
        "max_rungs": 5,
        "max_concurrent_trials": 3,
        "max_trials": 9,
        "mode": "standard",
    }
    driver, stopped_at = _simulate(tmp_path, searcher, 90, 10)
    trials = driver.trials()
    assert len(trials) == 9
    # A second driver on the finished search finds nothing to run.
    assert SearchDriver(str(tmp_path / "search.journal"), "sim").next_trial() is None
    by_bracket: dict[int, list[int]] = {0: [], 1: []}
    for trial in trials:
        by_bracket[trial.bracket].append(stopped_at[trial.number])
    assert Counter(by_bracket[0]) == {10: 5, 90: 1}
    assert Counter(by_bracket[1]) == {30: 2, 90: 1}


def test_random_single_and_grid_searches(tmp_path: pathlib.Path) -> None:
    # random_test.go TestRandomSearchMethod / TestSingleSearchMethod, grid_test.go
    # TestGridSearchMethod: every trial runs to the end; grid covers a = 0..3 once each.
    random = {"name": "random", "metric": "loss", "max_trials": 4, "max_concurrent_trials": 2}
    driver, stopped_at = _simulate(tmp_path / "r", random, 100, 10)
    trials = driver.trials()
    assert len(trials) == 4 and not stopped_at
    assert all(0 <= t.hparams["x"] <= 10 and t.state == "completed" for t in trials)
    driver, stopped_at = _simulate(tmp_path / "s", {"name": "single"}, 100, 10)
    assert len(driver.trials()) == 1 and not stopped_at
    grid = SearchSpec(
        SEARCHER.validate_python({"name": "grid", "metric": "loss", "max_concurrent_trials": 2}),
        {"a": {"type": "int", "minval": 0, "maxval": 3, "count": 4}},
        1,
    )
    driver = SearchDriver(str(tmp_path / "grid.journal"), "grid", grid)
    order = []
    while (trial := driver.next_trial()) is not None:
        order.append(trial.hparams["a"])
        driver.report(trial, 100, 1.0)
        driver.complete(trial)
    assert order == [3, 2, 1, 0]  # taken from the end of the grid, as Determined does
