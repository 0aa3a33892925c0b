"""Hyperparameter spaces and the searcher section: forms, sampling, grid points, messages.

Expected grid points are those of Determined 0.38.1's own Go tests
(master/pkg/searcher/grid_test.go); the cases name the test they come from.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import lightning_bridge
from lightning_bridge import InvalidArgumentError, InvalidHP
from lightning_bridge._errors import is_invalid_hp
from lightning_bridge.contract import _import_map
from lightning_bridge.experiment.config._config import parse_config
from lightning_bridge.search import grid_points, parse_space, trial_draw
from lightning_bridge.search._grid import axis, round_half_away
from lightning_bridge.search._space import HP_FORM


def _space(hparams: dict[str, Any]) -> Any:
    space, problems = parse_space(hparams)
    assert not problems
    return space


def _int(lo: int, hi: int, count: int) -> dict[str, Any]:
    return {"type": "int", "minval": lo, "maxval": hi, "count": count}


def _double(lo: float, hi: float, count: int) -> dict[str, Any]:
    return {"type": "double", "minval": lo, "maxval": hi, "count": count}


def test_grid_size_is_the_product_of_counts() -> None:
    # grid_test.go TestGridFunctionality: doubles on [-1, 1] with these counts.
    for counts in ([1], [4], [1, 4], [3, 4], [2, 3, 4], [2, 2, 3, 3, 4, 5]):
        space = _space({str(i): _double(-1.0, 1.0, c) for i, c in enumerate(counts)})
        assert len(grid_points(space)) == math.prod(counts)


def test_grid_axes() -> None:
    # grid_test.go TestHyperparameterGridMethod: axis lengths, and an empty nested group stays.
    form = HP_FORM.validate_python
    assert len(axis(form(_double(0.0, 2.0, 5)))) == 5
    assert len(axis(form(_int(0, 20, 7)))) == 7
    assert len(axis(form({"type": "log", "base": 10, "minval": -3, "maxval": -2, "count": 2}))) == 2
    assert axis(form({"type": "categorical", "vals": [1, 2, 3]})) == [1, 2, 3]
    assert axis(form({"type": "const", "val": 3})) == [3]
    nested = _space({"x": {"empty": {}, "full": {"type": "categorical", "vals": [1, 2, 3]}}})
    assert grid_points(nested) == [{"x": {"empty": {}, "full": v}} for v in (1, 2, 3)]


def test_grid_order_and_nesting() -> None:
    # grid_test.go TestGrid and TestNestedGrid: the first name varies slowest.
    flat = grid_points(_space({"1": _int(0, 20, 3), "2": _int(0, 10, 3)}))
    assert flat == [{"1": a, "2": b} for a in (0, 10, 20) for b in (0, 5, 10)]
    nested = grid_points(_space({"1": _int(0, 20, 3), "2": {"3": _int(0, 10, 3)}}))
    assert nested == [{"1": a, "2": {"3": b}} for a in (0, 10, 20) for b in (0, 5, 10)]


def test_grid_nested_further() -> None:
    # grid_test.go TestNestedGridFurther: the 16 points, each once.
    space = _space(
        {
            "constant": 2,
            "a": {"b": {"c1": {"type": "categorical", "vals": [3, 5]}, "c2": _int(7, 11, 2)}},
            "f": _double(13.0, 17.0, 2),
            "l": {"type": "log", "minval": 1, "maxval": 2, "base": 10, "count": 2},
        }
    )
    got = [json.dumps(p, sort_keys=True) for p in grid_points(space)]
    expected = {
        json.dumps(
            {"a": {"b": {"c1": c1, "c2": c2}}, "constant": 2, "f": f, "l": l}, sort_keys=True
        )
        for c1 in (3, 5)
        for c2 in (7, 11)
        for f in (13.0, 17.0)
        for l in (10.0, 100.0)  # noqa: E741
    }
    assert len(got) == 16 and set(got) == expected


def test_grid_int_points() -> None:
    # grid_test.go TestGridIntCount and TestGridIntCountNegative.
    assert [p["1"] for p in grid_points(_space({"1": _int(0, 4, 5)}))] == [0, 1, 2, 3, 4]
    assert [p["1"] for p in grid_points(_space({"1": _int(-4, -2, 3)}))] == [-4, -3, -2]
    # count is clamped to the integers in the range; halves round away from zero (Go's
    # math.Round), so count 1 over 0..1 is 1 where Python's round would give 0.
    assert [p["1"] for p in grid_points(_space({"1": _int(0, 2, 10)}))] == [0, 1, 2]
    assert [p["1"] for p in grid_points(_space({"1": _int(0, 1, 1)}))] == [1]
    assert [p["1"] for p in grid_points(_space({"1": _int(-1, 0, 1)}))] == [-1]
    assert [p["1"] for p in grid_points(_space({"1": _int(0, 10, 4)}))] == [0, 3, 7, 10]
    assert round_half_away(2.5) == 3 and round_half_away(-2.5) == -3


def test_grid_double_and_log_points() -> None:
    assert [p["x"] for p in grid_points(_space({"x": _double(0.0, 1.0, 3)}))] == [0.0, 0.5, 1.0]
    assert [p["x"] for p in grid_points(_space({"x": _double(0.0, 1.0, 1)}))] == [0.5]
    log = {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 4}
    assert [p["x"] for p in grid_points(_space({"x": log}))] == pytest.approx(
        [1e-4, 1e-3, 1e-2, 1e-1]
    )
    log1 = {**log, "count": 1}
    assert [p["x"] for p in grid_points(_space({"x": log1}))] == pytest.approx([10**-2.5])


def test_sampling_stays_in_range_and_is_reproducible() -> None:
    space = _space(
        {
            "n": {"type": "int", "minval": 1, "maxval": 3},
            "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -2},
            "p": {"type": "double", "minval": 0.1, "maxval": 0.2},
            "arch": {"type": "categorical", "vals": [[64, 32], {"depth": 2}, "small"]},
            "opt": {"name": "sgd", "momentum": {"type": "const", "val": 0.9}},
        }
    )
    draws = [trial_draw(space, 11, request) for request in range(200)]
    assert {hp["n"] for _, hp in draws} == {1, 2, 3}  # both ends included
    assert all(1e-4 <= hp["lr"] <= 1e-2 and 0.1 <= hp["p"] <= 0.2 for _, hp in draws)
    assert {json.dumps(hp["arch"]) for _, hp in draws} == {
        "[64, 32]",
        '{"depth": 2}',
        '"small"',
    }
    assert all(hp["opt"] == {"name": "sgd", "momentum": 0.9} for _, hp in draws)
    assert all(0 <= seed < 2**31 for seed, _ in draws)
    assert draws == [trial_draw(space, 11, request) for request in range(200)]
    assert draws != [trial_draw(space, 12, request) for request in range(200)]
    assert list(draws[0][1]) == ["n", "lr", "p", "arch", "opt"]  # the config's order


def _error(config: dict[str, Any]) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        parse_config(config)
    return str(info.value)


@pytest.mark.parametrize(
    ("hparam", "line"),
    [
        (
            {"type": "int", "minval": 3, "maxval": 3},
            "hyperparameters.x: minval must be less than maxval, got {maxval: 3, minval: 3, ",
        ),
        (
            {"type": "double", "minval": 0.5, "maxval": 0.1},
            "hyperparameters.x: minval must be less than maxval",
        ),
        ({"type": "int", "minval": 0.5, "maxval": 2}, "hyperparameters.x.minval: expected an int"),
        (
            {"type": "log", "base": 0, "minval": -3, "maxval": -1},
            "hyperparameters.x.base: expected a positive number, got 0",
        ),
        ({"type": "log", "minval": -3, "maxval": -1}, "hyperparameters.x.base: required"),
        ({"type": "categorical", "vals": []}, "hyperparameters.x.vals: "),
        ({"type": "categorical", "vals": "ab"}, "hyperparameters.x.vals: expected a list"),
        (
            {"type": "int", "minval": 0, "maxval": 3, "count": 0},
            "hyperparameters.x.count: expected an integer of at least 1, got 0",
        ),
        ({"type": "int", "minval": 0, "maxval": 3, "step": 1}, "hyperparameters.x.step: unknown"),
    ],
)
def test_malformed_forms_name_the_key(hparam: dict[str, Any], line: str) -> None:
    assert line in _error({"hyperparameters": {"x": hparam}})


_ASHA = {"name": "adaptive_asha", "metric": "loss", "max_trials": 8}


@pytest.mark.parametrize(
    ("searcher", "line"),
    [
        ({"name": "custom"}, "searcher.name: the custom searcher was removed from Determined"),
        ({"name": "pbt"}, "searcher.name: the pbt (population-based training) searcher was"),
        ({"name": "adaptive_simple"}, "searcher.name: the adaptive_simple searcher was removed"),
        ({"name": "adaptive"}, "searcher.name: the adaptive searcher was removed"),
        ({"name": "sync_halving"}, "searcher.name: the sync_halving searcher was removed"),
        (
            {"name": "bayes"},
            "searcher.name: expected one of single, random, grid, adaptive_asha, async_halving, "
            "got 'bayes'",
        ),
        ({"name": "random", "metric": "loss"}, "searcher.max_trials: required (how many"),
        ({"name": "grid"}, "searcher.metric: required (the validation metric that ranks"),
        (_ASHA, "searcher: the adaptive_asha searcher needs max_time and time_metric"),
        (
            {**_ASHA, "max_time": 100, "time_metric": "batches", "divisor": 1},
            "searcher.divisor: expected a number greater than 1, got 1",
        ),
        (
            {**_ASHA, "max_time": 100, "time_metric": "batches", "mode": "fast"},
            "searcher.mode: expected 'aggressive', 'standard' or 'conservative', got 'fast'",
        ),
        (
            {**_ASHA, "max_time": 100, "time_metric": "batches", "bracket_rungs": [2, 0]},
            "searcher.bracket_rungs.1: expected an integer of at least 1, got 0",
        ),
        (
            {"name": "async_halving", "metric": "loss", "max_trials": 4, "max_time": 10},
            "searcher.num_rungs: required",
        ),
        (
            {"name": "random", "metric": "loss", "max_trials": 2, "max_concurrent_trials": -1},
            "searcher.max_concurrent_trials: expected a non-negative integer, got -1",
        ),
    ],
)
def test_malformed_searchers_name_the_key(searcher: dict[str, Any], line: str) -> None:
    assert line in _error({"searcher": searcher})


def test_grid_needs_a_count_on_every_range() -> None:
    message = _error(
        {
            "searcher": {"name": "grid", "metric": "loss"},
            "hyperparameters": {
                "lr": {"type": "double", "minval": 0.1, "maxval": 0.2},
                "opt": {"m": {"type": "int", "minval": 1, "maxval": 2, "count": 2}},
                "b": {"type": "categorical", "vals": [1, 2]},
            },
        }
    )
    assert "hyperparameters.lr: the grid searcher needs count" in message
    assert "--set hyperparameters.lr.count=4" in message
    assert "opt.m" not in message and "hyperparameters.b" not in message


def test_a_grid_without_hyperparameters_is_accepted_and_starts_no_trial() -> None:
    # Determined accepts it: the grid of no axis has no point, and the experiment completes.
    empty = parse_config({"searcher": {"name": "grid", "metric": "loss"}})
    assert empty.starts_no_trial
    assert empty.first_configuration().hparams == {}
    consts = parse_config(
        {"searcher": {"name": "grid", "metric": "loss"}, "hyperparameters": {"a": 1}}
    )
    assert not consts.starts_no_trial and consts.first_configuration().hparams == {"a": 1}


def test_search_configs_are_accepted_with_determined_defaults() -> None:
    conf = parse_config(
        {
            "searcher": {**_ASHA, "max_time": 100, "time_metric": "batches"},
            "hyperparameters": {"lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1}},
            "reproducibility": {"experiment_seed": 3},
        }
    )
    searcher: Any = conf.model.searcher
    assert conf.is_search
    assert (searcher.divisor, searcher.max_rungs, searcher.mode) == (4.0, 5, "standard")
    assert (searcher.max_concurrent_trials, searcher.bracket_rungs) == (16, [])
    assert conf.search.experiment_seed == 3 and conf.search.hyperparameters["lr"]["base"] == 10
    legacy = parse_config({"searcher": {**_ASHA, "max_length": {"batches": 100}}})
    assert legacy.model.searcher.length() == ("batches", 100)
    warm = parse_config({"searcher": {"name": "single", "source_checkpoint_uuid": "abc"}})
    assert warm.model.searcher.source_checkpoint_uuid == "abc"
    assert warm.unused_keys == []  # used: the trial starts from that checkpoint


def test_invalid_hp_is_exported_and_recognised() -> None:
    assert InvalidHP("too big").msg == "too big"
    with pytest.raises(TypeError, match="message string"):
        InvalidHP(3)  # type: ignore[arg-type]
    assert is_invalid_hp(InvalidHP()) and not is_invalid_hp(ValueError())
    # Determined's own class (a trial importing a real Determined) is recognised by name.
    determined_invalid = type("InvalidHP", (Exception,), {"__module__": "determined._execution"})
    assert is_invalid_hp(determined_invalid())
    assert not is_invalid_hp(type("InvalidHP", (Exception,), {"__module__": "mylib"})())
    _import_map.install(force=True)
    try:
        import determined

        assert determined.InvalidHP is lightning_bridge.InvalidHP
    finally:
        _import_map.uninstall()
