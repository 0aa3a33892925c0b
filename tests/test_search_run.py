"""Searches run end to end by `lightning-bridge`, as a user runs them: trials as subprocesses,
two at a time on this two-core machine, reporting to the search themselves.

One adaptive_asha search is stopped with SIGINT while it trains and continued with
`experiment continue`; its rung lengths and stop decisions are replayed from the metrics the
trials actually reported by an independent implementation of Determined's rule, and its
record and checkpoints are checked. One random search has a trial that raises InvalidHP and
one that crashes. Each search is run once (module-scoped) and read by several tests.
"""

from __future__ import annotations

import copy
import json
import pathlib
import signal
import subprocess
from typing import Any

import pytest

from lightning_bridge.record._registry import Registry
from lightning_bridge.search import SearchDriver, parse_space, trial_draw
from tests import _folders as sf

pytest.importorskip("optuna")
pytestmark = [pytest.mark.slow, pytest.mark.search]

ASHA = sf.ASHA_CONFIG  # 3 rungs at 4, 8, 16 batches; 2 trials at once
RUNGS = [4, 8, 16]


class Search:
    """A finished search: its workspace, record, search view and the commands' output."""

    def __init__(self, workspace: pathlib.Path, experiment_id: int, outputs: list[str]) -> None:
        self.workspace = workspace
        self.experiment_id = experiment_id
        self.outputs = outputs
        with Registry(workspace) as registry:
            self.experiment = registry.experiment(experiment_id)
            self.trials = registry.trials(experiment_id)
            self.validations = {
                t.id: [m.batches for m in registry.metrics(t.id, "validation")] for t in self.trials
            }
            self.checkpoints = registry.checkpoints(experiment_id=experiment_id)
            self.best = registry.best_checkpoints(experiment_id, 1)
        search = self.experiment.options["search"]
        storage = search["storage"] or str(
            workspace / f"experiments/{experiment_id}/search.journal"
        )
        driver = SearchDriver(storage, search["name"])
        self.views = driver.trials()
        self.finished = driver.is_finished()
        driver.close()


def _run(args: list[str], cwd: pathlib.Path, log: pathlib.Path) -> str:
    process = sf.start(args, cwd, log)
    out = sf.finish_logged(process, log)
    assert process.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def asha(tmp_path_factory: pytest.TempPathFactory) -> Search:
    root = tmp_path_factory.mktemp("asha")
    # Every trial ASHA lets go on past its first rung is held there until the search is
    # continued: the search cannot end before the Ctrl-C.
    gate = sf.Gate.at(root / "gate")
    config = copy.deepcopy(ASHA)
    config["hyperparameters"].update(gate.hparams(RUNGS[0]))
    path = sf.write_folder(root, config, "folder", sf.TINY)
    workspace = root / "workspace"
    log = root / "run.log"
    run = sf.start(["run", str(path), "--workspace", str(workspace)], root, log)

    def trained_first_rung() -> bool:
        if not (workspace / "registry.sqlite").is_file():
            return False
        with Registry(workspace) as registry:
            return any(
                m.batches >= RUNGS[0]
                for t in registry.trials()
                for m in registry.metrics(t.id, "validation")
            )

    sf.wait_for(trained_first_rung, run, 240, "a trial to reach its first rung", log)
    sf.wait_for(gate.reached, run, 240, "a trial held past its first rung", log)
    run.send_signal(signal.SIGINT)  # Ctrl-C on the command (its trials are signalled by it)
    # The stop is under way: the held trial goes on to where it acts on it.
    gate.release()
    first = sf.finish_logged(run, log)
    assert run.returncode == 0, first
    assert "The search stopped" in first and "experiment continue 1" in first, first
    resumed = _run(["experiment", "continue", "1", "--workspace", str(workspace)], root,
                   root / "continue.log")  # fmt: skip
    return Search(workspace, 1, [first, resumed])


def _replay(views: list[Any], rungs: list[int], divisor: float) -> list[tuple[int, int, bool]]:
    """Determined's ASHA stop rule, applied afresh to every report in the order the search
    took them: a trial reaching a rung is ranked among the metrics already there (ties rank
    it first) and continues while its rank is below max(int(rung size / divisor), 1); the top
    rung always stops. Returns (trial, length, stop) per report."""
    reports = sorted(
        (when, view.number, length, metric)
        for view in views
        for length, metric, _stop, when in view.reports
    )
    in_rung: list[list[float]] = [[] for _ in rungs]
    reached = {view.number: 0 for view in views}
    decisions = []
    for _when, number, length, metric in reports:
        stop = False
        while reached[number] < len(rungs) and length >= rungs[reached[number]]:
            rung = reached[number]
            better = sum(value < metric for value in in_rung[rung])
            in_rung[rung].append(metric)
            reached[number] += 1
            if rung == len(rungs) - 1 or better >= max(int(len(in_rung[rung]) / divisor), 1):
                stop = True
                break
        decisions.append((number, length, stop))
    return decisions


def test_asha_stops_where_determined_stops(asha: Search) -> None:
    assert asha.finished
    # max_trials trials: each stop below the top rung started the next one.
    assert sorted(v.number for v in asha.views) == [0, 1, 2, 3]
    taken = [(v.number, length, stop) for v in asha.views for length, _m, stop, _t in v.reports]
    assert sorted(taken) == sorted(_replay(asha.views, RUNGS, 2.0))
    # Every trial reported at its rungs and nowhere else, up to the one it stopped at.
    for view in asha.views:
        lengths = [length for length, *_ in view.reports]
        stopped_at = next(length for length, _m, stop, _t in view.reports if stop)
        assert lengths == [r for r in RUNGS if r <= stopped_at], view
    assert any(v.state == "stopped" for v in asha.views), "some trial stopped below the top"
    assert any(v.state == "completed" for v in asha.views), "some trial trained to the end"


def test_asha_record_matches_the_search(asha: Search) -> None:
    # One recorded trial per search trial, COMPLETED as Determined shows a trial its searcher
    # stopped; validations at the rung lengths; trained exactly to the rung it stopped at.
    assert len(asha.trials) == len(asha.views) == 4
    by_seed = {t.seed: t for t in asha.trials}
    assert sorted(by_seed) == sorted(v.seed for v in asha.views)
    for view in asha.views:
        trial = by_seed[view.seed]
        assert trial.state == "COMPLETED", trial
        assert trial.hparams == view.hparams
        stopped_at = max(length for length, *_ in view.reports)
        assert trial.batches_trained == stopped_at
        assert asha.validations[trial.id] == [r for r in RUNGS if r <= stopped_at]
        # The trial trained with the seed the search drew for it.
        seen = json.loads((pathlib.Path(trial.run_dir) / "seen.json").read_text())
        assert seen["seed"] == view.seed
        assert (pathlib.Path(trial.run_dir) / "output.log").is_file()


def test_asha_interrupted_trials_continue_from_their_checkpoints(asha: Search) -> None:
    # The interrupted trials ran twice, continuing their checkpoint: their metrics were
    # recorded once per rung (no rung reported twice to the search); trials that had ended
    # before the interrupt did not run again.
    twice = [t for t in asha.trials if t.runs == 2]
    assert twice, [(t.id, t.runs) for t in asha.trials]
    for trial in twice:
        log = pathlib.Path(trial.log_file).read_text()
        assert "Continuing from checkpoint" in log
    assert all(t.runs in (1, 2) for t in asha.trials)
    assert "continuing search" in asha.outputs[1]


def test_asha_checkpoints_and_best(asha: Search) -> None:
    # Each trial's checkpoint at its stop is kept and complete; the best is listed.
    for trial in asha.trials:
        own = [c for c in asha.checkpoints if c.trial_id == trial.id]
        assert own and max(c.batches for c in own) == trial.batches_trained
        assert all((pathlib.Path(c.location) / "metadata.json").is_file() for c in own)
    best = min(
        (c for c in asha.checkpoints if "validation_loss" in c.metrics),
        key=lambda c: c.metrics["validation_loss"],
    )
    assert asha.best[0].uuid == best.uuid
    listed = subprocess.run(
        sf.command("checkpoint", "list", "--best", "--workspace", str(asha.workspace)),
        capture_output=True, text=True, env=sf.cli_env(), timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0 and best.uuid in listed.stdout, listed.stdout
    assert f"Best checkpoint: trial {best.trial_id}" in asha.outputs[1]


# random: 2 trials that count; mode drawn from ok / invalid / crash.
RANDOM = {
    **sf.SEARCH_CONFIG,
    "hyperparameters": {
        **sf.SEARCH_CONFIG["hyperparameters"],
        "mode": {"type": "categorical", "vals": ["ok", "ok", "invalid", "crash"]},
    },
    "searcher": {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": 2,
        "max_length": {"batches": 4},
        "max_concurrent_trials": 2,
    },
}


def _random_seed() -> tuple[int, list[str]]:
    """An experiment seed whose draws give an InvalidHP trial and a crash among the first
    trials, and the modes the search then runs: random replaces an InvalidHP trial (it does
    not count against max_trials), and counts a crashed one."""
    space, problems = parse_space(RANDOM["hyperparameters"])
    assert not problems
    for seed in range(200):
        modes: list[str] = []
        while sum(m != "invalid" for m in modes) < 2:
            modes.append(trial_draw(space, seed, len(modes))[1]["mode"])
        if sorted(modes) == ["crash", "invalid", "ok"]:
            return seed, modes
    raise AssertionError("no seed gives both outcomes")


def test_random_search_invalid_hp_and_a_crash(tmp_path: pathlib.Path) -> None:
    seed, modes = _random_seed()
    config = copy.deepcopy(RANDOM)
    config["reproducibility"] = {"experiment_seed": seed}
    path = sf.write_folder(tmp_path, config, "folder", sf.TINY)
    workspace = tmp_path / "workspace"
    out = _run(["run", str(path), "--workspace", str(workspace)], tmp_path, tmp_path / "run.log")
    search = Search(workspace, 1, [out])
    assert search.finished
    assert [v.hparams["mode"] for v in search.views] == modes
    states = {v.hparams["mode"]: v.state for v in search.views}
    assert states == {"ok": "completed", "invalid": "invalid_hp", "crash": "errored"}
    by_seed = {t.seed: t for t in search.trials}
    for view in search.views:
        trial = by_seed[view.seed]
        mode = view.hparams["mode"]
        if mode == "ok":
            assert trial.state == "COMPLETED" and trial.batches_trained == 4
        elif mode == "invalid":  # Determined ends it; the search replaced it
            assert trial.state == "COMPLETED" and trial.message.startswith("InvalidHP: ")
            assert "InvalidHP: mode=invalid cannot train" in out
        else:  # the search went on past the crash
            assert trial.state == "ERROR"
            output = (pathlib.Path(trial.run_dir) / "output.log").read_text()
            assert "deliberate crash in __init__" in output


def test_a_grid_without_hyperparameters_completes_without_a_trial(tmp_path: pathlib.Path) -> None:
    # Determined accepts the config, starts no trial and completes the experiment.
    config = {**sf.SEARCH_CONFIG, "searcher": {"name": "grid", "metric": "validation_loss"}}
    config["searcher"]["max_length"] = {"batches": 4}
    del config["hyperparameters"]
    path = sf.write_folder(tmp_path, config, "folder", sf.TINY)
    workspace = tmp_path / "workspace"
    out = _run(["run", str(path), "--workspace", str(workspace)], tmp_path, tmp_path / "run.log")
    assert "0 trials in all" in out
    assert "the grid searcher has no hyperparameter to search over" in out
    listed = subprocess.run(
        sf.command("experiment", "list", "--json", "--workspace", str(workspace)),
        capture_output=True,
        text=True,
        check=True,
        env=sf.cli_env(),
    )
    [experiment] = json.loads(listed.stdout)
    assert (experiment["state"], experiment["trials"]) == ("COMPLETED", 0)


def test_a_grid_over_constants_alone_runs_their_one_trial(tmp_path: pathlib.Path) -> None:
    # Determined's grid is the product of one axis per hyperparameter; a constant is an axis
    # of one value, so a grid over no range is one trial with the constants (and a grid over
    # no hyperparameter at all, above, none).
    hparams = {"global_batch_size": 8, "lr": 0.01, "opt": {"beta": 0.9}}
    config = {**sf.SEARCH_CONFIG, "hyperparameters": hparams}
    config["searcher"] = {"name": "grid", "metric": "validation_loss", "max_length": {"batches": 4}}
    path = sf.write_folder(tmp_path, config, "folder", sf.TINY)
    workspace = tmp_path / "workspace"
    out = _run(["run", str(path), "--workspace", str(workspace)], tmp_path, tmp_path / "run.log")
    search = Search(workspace, 1, [out])
    assert search.finished
    assert [(v.state, v.hparams) for v in search.views] == [("completed", hparams)]
    [trial] = search.trials
    assert (trial.state, trial.batches_trained, trial.hparams) == ("COMPLETED", 4, hparams)
    assert search.validations[trial.id] == [4]


def test_experiment_kill_ends_a_search_on_this_machine(tmp_path: pathlib.Path) -> None:
    """`experiment kill` on a local search: both running trials end at once, recorded
    STOPPED ("killed"), and the search's worker starts none of the other two and ends. Both
    trials are held after 2 batches (of their first rung's 4) and never released: none can
    complete, and without the kill the search could not end."""
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(ASHA)
    config["hyperparameters"].update(gate.hparams(2))
    path = sf.write_folder(tmp_path, config, "folder", sf.TINY)
    workspace = tmp_path / "workspace"
    log = tmp_path / "run.log"
    run = sf.start(["run", str(path), "--workspace", str(workspace)], tmp_path, log)
    sf.wait_for(lambda: gate.reached() == 2, run, 240, "both trials held", log)
    killed = sf.start(["experiment", "kill", "1", "--workspace", str(workspace)], tmp_path,
                      tmp_path / "kill.log")  # fmt: skip
    assert killed.wait(timeout=120) == 0, (tmp_path / "kill.log").read_text()
    out = sf.finish_logged(run, log)
    with Registry(workspace) as registry:
        trials = registry.trials(1)
    assert [(t.state, t.message.split(" (")[0]) for t in trials] == [("STOPPED", "killed")] * 2, (
        trials,
        out,
    )
    assert "The experiment is paused: no other trial starts" in out, out
