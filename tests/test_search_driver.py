"""SearchDriver on real Optuna storages: shared by processes, InvalidHP, failures, resuming.

No training: trials report synthetic metrics. Storages are real files (Optuna's journal file,
SQLite) in the test's temporary folder.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import pathlib
import sys
import time
import uuid
from typing import Any

import pytest

from lightning_bridge import InvalidArgumentError
from lightning_bridge.search import SEARCHER, SearchDriver, SearchSpec, search_exists

optuna = pytest.importorskip("optuna")


def _spec(searcher: dict[str, Any], hparams: dict[str, Any] | None = None) -> SearchSpec:
    hparams = hparams or {"x": {"type": "int", "minval": 0, "maxval": 9}}
    return SearchSpec(SEARCHER.validate_python(searcher), hparams, 5)


def _work(driver: SearchDriver) -> list[int]:
    """Run trials until the search is finished: each reports a synthetic metric (its
    hyperparameter `x`) every 10 units up to 90 and stops when told; returns their numbers."""
    ran = []
    while not driver.is_finished():
        trial = driver.next_trial()
        if trial is None:
            time.sleep(0.02)  # others are still running trials that may start new ones
            continue
        ran.append(trial.number)
        for units in range(10, 91, 10):
            time.sleep(0.005)
            if driver.report(trial, units, float(trial.hparams["x"])).stop:
                break
        driver.complete(trial)
    return ran


def _other_worker(storage: str, name: str, out: str, ready: Any, go: Any) -> None:
    driver = SearchDriver(storage, name)
    ready.set()
    go.wait(60)
    pathlib.Path(out).write_text(json.dumps(_work(driver)))


@pytest.mark.parametrize(
    "kind", ["journal", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_two_workers_share_one_search(
    tmp_path: pathlib.Path, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "postgresql":
        storage = request.getfixturevalue("postgres").url
    else:
        storage = {
            "journal": str(tmp_path / "search.journal"),
            "sqlite": f"sqlite:///{tmp_path}/s.db",
        }[kind]
    name = f"shared-{uuid.uuid4().hex[:8]}"  # a server outlives the test
    searcher = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_trials": 12,
        "max_time": 90,
        "time_metric": "batches",
        "divisor": 3,
        "max_concurrent_trials": 4,
    }
    # This process is one worker, a forked process (its own driver, storage connection and
    # lock handle) the other; they start together.
    context = multiprocessing.get_context("fork")
    ready, go, out = context.Event(), context.Event(), tmp_path / "other.json"
    SearchDriver(storage, name, _spec(searcher)).close()
    other = context.Process(target=_other_worker, args=(storage, name, str(out), ready, go))
    other.start()
    try:
        assert ready.wait(60), "the other worker did not start"
        driver = SearchDriver(storage, name)
        go.set()
        mine = _work(driver)
        other.join(120)
        assert other.exitcode == 0
    finally:
        other.kill()
    ran = [mine, json.loads(out.read_text())]
    assert all(ran), f"each worker pulls trials: {ran}"
    assert not set(ran[0]) & set(ran[1]), "no trial is pulled twice"
    trials = driver.trials()
    assert sorted(ran[0] + ran[1]) == [t.number for t in trials]
    assert driver.is_finished() and len(trials) == 12
    assert all(t.state in ("completed", "stopped") and t.metrics for t in trials)
    # Each bracket started exactly its share of max_trials (every stop made one more trial):
    # 3 rungs at most (int(log 12 / log 3) + 1), standard mode: brackets of 3 and 2 rungs,
    # weighted 3**2 / 3 and 3 / 2, so 12 trials are shared 8 / 4.
    counts: dict[int, int] = {}
    for trial in trials:
        counts[trial.bracket] = counts.get(trial.bracket, 0) + 1
    assert counts == {0: 8, 1: 4}


def _finish(driver: SearchDriver, number: int, length: int, metric: float) -> bool:
    """Pull the next trial (it must be `number`), report once; return the stop decision."""
    trial = driver.next_trial()
    assert trial is not None and trial.number == number
    return driver.report(trial, length, metric).stop


def test_invalid_hp_is_replaced_where_determined_replaces(tmp_path: pathlib.Path) -> None:
    journal = str(tmp_path / "search.journal")
    # random: an InvalidHP trial does not count against max_trials; an error does.
    random = SearchDriver(
        journal,
        "random",
        _spec({"name": "random", "metric": "loss", "max_trials": 2, "max_concurrent_trials": 1}),
    )
    for number, outcome in enumerate(["invalid", "error", "ok"]):
        trial = random.next_trial()
        assert trial is not None and trial.number == number
        if outcome == "ok":
            random.complete(trial)
        else:
            random.fail(trial, invalid_hp=outcome == "invalid")
    assert [t.state for t in random.trials()] == ["invalid_hp", "errored", "completed"]
    assert random.is_finished() and random.next_trial() is None
    # single and grid: not replaced (grid's point is used up).
    single = SearchDriver(journal, "single", _spec({"name": "single"}))
    single.fail(single.next_trial() or 0, invalid_hp=True)
    assert single.is_finished() and len(single.trials()) == 1
    grid_hp = {"x": {"type": "categorical", "vals": ["a", "b"]}}
    grid = SearchDriver(
        journal,
        "grid",
        _spec({"name": "grid", "metric": "loss", "max_concurrent_trials": 1}, grid_hp),
    )
    grid.fail(grid.next_trial() or 0, invalid_hp=True)
    grid.complete(grid.next_trial() or 0)
    assert [(t.hparams["x"], t.state) for t in grid.trials()] == [
        ("b", "invalid_hp"),
        ("a", "completed"),
    ]
    assert grid.is_finished()


def test_asha_invalid_hp_and_errors(tmp_path: pathlib.Path) -> None:
    searcher = {
        "name": "async_halving",
        "metric": "loss",
        "num_rungs": 2,
        "divisor": 2,
        "max_time": 4,
        "time_metric": "batches",
        "max_trials": 3,
        "max_concurrent_trials": 2,
    }
    driver = SearchDriver(str(tmp_path / "search.journal"), "asha", _spec(searcher))
    first, second = driver.next_trial(), driver.next_trial()
    assert first is not None and second is not None and first.rungs == (2, 4)
    assert driver.report(first, 2, 1.0).next_rung == 4  # best of 1: goes on to rung 4
    assert not driver.report(second, 2, 0.5).stop  # best of 2
    # InvalidHP: its 0.5 leaves rung 0 and a new trial replaces it.
    driver.fail(second, invalid_hp=True)
    # Ranked against [1.0] alone, 0.8 is best of 2 and goes on (against [0.5, 1.0] it would
    # rank second of 3 and stop).
    assert not _finish(driver, 2, 2, 0.8)
    # An error counts as the worst metric in the rung the trial was working towards (rung 1)
    # and starts a new trial while the bracket has fewer than max_trials valid ones (2 < 3).
    driver.fail(first)
    assert _finish(driver, 3, 2, 2.0)  # third of 3 in rung 0: stopped; 3 valid, no new trial
    assert driver.report(2, 4, 0.7).stop  # the top rung stops every trial
    driver.complete(2)
    driver.complete(3)
    trials = driver.trials()
    assert [t.state for t in trials] == ["errored", "invalid_hp", "completed", "stopped"]
    assert trials[0].rungs == {0: [1.0], 1: [1.7976931348623157e308]}
    assert trials[2].rungs == {0: [0.8], 1: [0.7]}
    assert driver.is_finished() and driver.next_trial() is None


def _play(driver: SearchDriver, reports: int | None = None) -> int:
    """Run the search's trials one at a time, a validation every 2 units, metric a function of
    the trial's `x` and length; a resumed trial goes on after its last report. Stop (leaving
    a trial running, as a killed worker does) after `reports` reports; return how many."""
    done = 0
    while (trial := driver.next_trial()) is not None:
        reported = next(t.metrics for t in driver.trials() if t.number == trial.number)
        start = max(reported, default=0) + 2
        for units in range(start, 9, 2):
            if reports is not None and done == reports:
                return done
            done += 1
            if driver.report(trial, units, abs(trial.hparams["x"] - 4) + 8 / units).stop:
                break
        driver.complete(trial)
    return done


def test_a_restarted_driver_goes_on_where_it_stopped(tmp_path: pathlib.Path) -> None:
    searcher = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_trials": 10,
        "max_time": 8,
        "time_metric": "batches",
        "divisor": 2,
        "max_concurrent_trials": 2,
    }
    whole = SearchDriver(str(tmp_path / "whole.journal"), "exp", _spec(searcher))
    _play(whole)
    # The same search, its worker killed after 7 reports with a trial running.
    path = str(tmp_path / "broken.journal")
    assert _play(SearchDriver(path, "exp", _spec(searcher), worker="a"), reports=7) == 7
    restarted = SearchDriver(path, "exp", _spec(searcher), worker="b")
    before = {t.number: t.state for t in restarted.trials()}
    assert restarted.requeue_stale(timeout_s=0.0) == [
        n for n, state in before.items() if state == "running"
    ]
    resumed = restarted.next_trial()
    assert resumed is not None and resumed.resumed
    restarted.pause(resumed)  # given back (Ctrl-C): pending again, resumed next time
    _play(restarted)
    # The same trials, values, rungs, stops and metrics as the search that was never stopped.
    assert restarted.trials() == whole.trials()
    assert len(whole.trials()) == 10 and whole.is_finished()


def test_the_trials_of_an_ended_scheduler_job_are_given_back(tmp_path: pathlib.Path) -> None:
    """Workers in two Slurm jobs pull trials; job 17 ends with its trial (cancelled, its node
    lost): `requeue_job("17")` gives back that trial only, which the next pull resumes."""
    searcher = {"name": "random", "metric": "loss", "max_trials": 3, "max_length": 9}
    path = str(tmp_path / "s.journal")
    in_17 = SearchDriver(path, "exp", _spec(searcher), job="17")
    in_18 = SearchDriver(path, "exp", worker="other:1", job="18")
    first, second = in_17.next_trial(), in_18.next_trial()
    assert first is not None and second is not None
    coordinator = SearchDriver(path, "exp")
    assert coordinator.requeue_job("19") == []
    assert coordinator.requeue_job("17") == [first.number]
    states = {t.number: t.state for t in coordinator.trials()}
    assert states[first.number] == "waiting" and states[second.number] == "running"
    again = in_18.next_trial()
    assert again is not None and again.number == first.number and again.resumed
    assert coordinator.requeue_job("17") == []  # pulled again, by job 18


def test_optuna_reads_the_search(tmp_path: pathlib.Path) -> None:
    hparams = {
        "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 2},
        "arch": {"type": "categorical", "vals": [[8, 8], {"depth": 2}]},
        "opt": {"momentum": {"type": "double", "minval": 0.5, "maxval": 0.9, "count": 2}},
        "batch": 16,
    }
    grid = {"name": "grid", "metric": "accuracy", "smaller_is_better": False}
    url = f"sqlite:///{tmp_path}/search.db"
    driver = SearchDriver(url, "grid", _spec(grid, hparams))
    while (trial := driver.next_trial()) is not None:
        driver.report(trial, 10, trial.hparams["opt"]["momentum"])
        driver.complete(trial)
    study = optuna.load_study(study_name="grid", storage=url)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert len(study.trials) == 8 and {t.state for t in study.trials} == {
        optuna.trial.TrialState.COMPLETE
    }
    first = study.trials[0]
    assert set(first.params) == {"lr", "arch", "opt.momentum"}
    assert first.params["arch"] in ("[8, 8]", '{"depth": 2}')
    assert math.isclose(first.params["lr"], 0.1) and first.distributions["lr"].log
    assert first.intermediate_values == {10: first.params["opt.momentum"]}
    assert math.isclose(study.best_value, 0.9)


def test_search_names_and_configs_are_checked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = str(tmp_path / "search.journal")
    with pytest.raises(InvalidArgumentError, match="no search named 'nope'"):
        SearchDriver(journal, "nope")
    SearchDriver(journal, "exp", _spec({"name": "random", "metric": "l", "max_trials": 2}))
    with pytest.raises(InvalidArgumentError, match="was started with another searcher"):
        SearchDriver(journal, "exp", _spec({"name": "random", "metric": "l", "max_trials": 3}))
    with pytest.raises(InvalidArgumentError, match="an in-memory database"):
        SearchDriver("sqlite://", "exp", _spec({"name": "single"}))
    with pytest.raises(InvalidArgumentError, match="expected a journal file path, sqlite"):
        SearchDriver("redis://localhost", "exp", _spec({"name": "single"}))
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(InvalidArgumentError, match=r"pip install 'lightning-bridge\[search\]'"):
        SearchDriver(journal, "exp")


def test_the_search_uses_optuna_s_public_api() -> None:
    """No private Optuna module or member in the search package (ruff's SLF001, set for the
    package in its ruff.toml, refuses private members too), and Optuna's storage interface,
    documented as not for library users, used in one place only: `SearchStudy.handle`."""
    import ast

    import lightning_bridge.search

    storage_methods = {n for n in dir(optuna.storages.BaseStorage) if not n.startswith("_")}
    allowed = {"get_study_id_from_name", "get_trial_id_from_study_id_trial_number"}
    package = pathlib.Path(lightning_bridge.search.__file__).parent
    found: list[str] = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
                modules = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                modules = []
            for module in modules:
                if module.startswith("optuna") and any(
                    p.startswith("_") for p in module.split(".")
                ):
                    found.append(f"{path.name}:{node.lineno}: {module}")
            if isinstance(node, ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                private = node.attr.startswith("_") and not node.attr.endswith("__")
                if private and owner not in ("self", "cls"):
                    found.append(f"{path.name}:{node.lineno}: .{node.attr}")
                if node.attr in storage_methods and not (
                    path.name == "_storage.py" and node.attr in allowed
                ):
                    found.append(f"{path.name}:{node.lineno}: storage.{node.attr}")
    assert not found


def test_search_exists_reads_without_creating(tmp_path: pathlib.Path) -> None:
    journal, db = tmp_path / "search.journal", tmp_path / "s.db"
    assert not search_exists(str(journal), "exp") and not journal.exists()
    assert not search_exists(f"sqlite:///{db}", "exp") and not db.exists()
    for url in (str(journal), f"sqlite:///{db}"):
        SearchDriver(url, "exp", _spec({"name": "single"})).close()
        assert search_exists(url, "exp") and not search_exists(url, "other")
    with pytest.raises(InvalidArgumentError, match="expected a journal file path, sqlite"):
        search_exists("redis://localhost", "exp")
