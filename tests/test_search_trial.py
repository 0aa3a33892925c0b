"""A search's trial in process, on the Trainer API: it validates at its rungs besides its own
validation period, reports every validation to the search (a real journal file), and the
searcher's stop ends the fit at the rung with a checkpoint, as a preemption would. No
subprocess: the run description a search worker writes is written here.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
from typing import Any

import pytest

from lightning_bridge import Batch
from lightning_bridge.search import SEARCHER, SearchDriver, SearchSpec, TrialSpec
from lightning_bridge.translation.services._run_description import (
    ENV_VAR,
    RunDescription,
    SearchConnection,
)
from tests._folders import ASHA_CONFIG
from tests._trials import LinearTrial, fit

pytest.importorskip("optuna")

# The searcher of the end-to-end ASHA tests, on the metric these trials report.
SEARCHER_CONFIG = {**ASHA_CONFIG["searcher"], "metric": "val_loss"}


def _as_search_trial(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, driver: SearchDriver, spec: TrialSpec
) -> dict[str, Any]:
    """Describe the run as a search worker does (`RunDescription`); the experiment config."""
    exp_conf = {"searcher": {**SEARCHER_CONFIG}, "reproducibility": {"experiment_seed": 1}}
    run = RunDescription(
        hparams=spec.hparams,
        config=exp_conf,
        trial_seed=spec.seed,
        search=SearchConnection(str(tmp_path / "search.journal"), driver.name, "val_loss", spec),
    )
    path = tmp_path / f"run-{spec.number}.json"
    run.write(path)
    monkeypatch.setenv(ENV_VAR, str(path))
    return exp_conf


def _driver(tmp_path: pathlib.Path) -> SearchDriver:
    hparams = {"global_batch_size": 8, "lr": {"type": "double", "minval": 0.01, "maxval": 0.05}}
    spec = SearchSpec(SEARCHER.validate_python(SEARCHER_CONFIG), hparams, 3)
    return SearchDriver(str(tmp_path / "search.journal"), "unit", spec)


class SeededTrial(LinearTrial):
    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.seed = context.get_trial_seed()


def test_rungs_are_validated_and_reported(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    driver = _driver(tmp_path)
    spec = driver.next_trial()
    assert spec is not None and spec.rungs == (4, 8, 16)
    exp_conf = _as_search_trial(tmp_path, monkeypatch, driver, spec)
    # The first trial of the rung goes on at each one; validation_period 5 adds its own.
    trial, trainer = fit(
        SeededTrial,
        init_kwargs={"exp_conf": exp_conf},
        max_length=Batch(16),
        validation_period=Batch(5),
        checkpoint_policy="none",
    )
    view = driver.trials()[spec.number]
    assert [(length, stop) for length, _m, stop, _t in view.reports] == [
        (4, False), (5, False), (8, False), (10, False), (15, False), (16, True),
    ]  # fmt: skip
    assert sorted(view.rungs) == [0, 1, 2] and view.state == "completed"
    assert trial.seed == spec.seed  # the trial's own seed, not the experiment's
    assert trainer.last_validation_metrics["val_loss"] == pytest.approx(view.metrics[16])


def test_a_stop_ends_the_fit_at_the_rung(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    driver = _driver(tmp_path)
    better = driver.next_trial()
    assert better is not None
    driver.report(better, 4, -1.0e9)  # a rung-0 metric no trial beats
    spec = driver.next_trial()
    assert spec is not None
    exp_conf = _as_search_trial(tmp_path, monkeypatch, driver, spec)
    _, trainer = fit(
        init_kwargs={"exp_conf": exp_conf, "checkpoint_dir": tmp_path / "checkpoints"},
        max_length=Batch(16),
        validation_period=Batch(100),
        checkpoint_policy="none",
    )
    view = driver.trials()[spec.number]
    # Ranked second of two at rung 0 (4 batches), not in the top half: stopped there, with a
    # checkpoint of batch 4 (the preemption path), closed in the search as stopped.
    assert [(length, stop) for length, _m, stop, _t in view.reports] == [(4, True)]
    assert view.state == "stopped"
    metadata = json.loads((trainer.checkpoints[-1] / "metadata.json").read_text())
    assert metadata["steps_completed"] == 4
    # The searcher replaced the stopped trial (the bracket has room for 4).
    assert len(driver.trials()) == 3


class SignalledAtBatch4(LinearTrial):
    """Sends itself SIGTERM while it trains batch 4 (a rung of the search)."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().train_batch(batch, epoch_idx, batch_idx)


@pytest.mark.parametrize("beaten", [False, True])
def test_a_signal_at_a_rung_validates_it_first(
    tmp_path: pathlib.Path, monkeypatch: Any, beaten: bool
) -> None:
    driver = _driver(tmp_path)
    if beaten:
        better = driver.next_trial()
        assert better is not None
        driver.report(better, 4, -1.0e9)  # a rung-0 metric no trial beats
    spec = driver.next_trial()
    assert spec is not None
    exp_conf = _as_search_trial(tmp_path, monkeypatch, driver, spec)
    kwargs: dict[str, Any] = {
        "init_kwargs": {"exp_conf": exp_conf, "checkpoint_dir": tmp_path / "checkpoints"},
        "max_length": Batch(16),
        "checkpoint_policy": "none",
    }
    view_of = lambda: driver.trials()[spec.number]  # noqa: E731
    if beaten:
        # The rung's metric decides: the searcher stops the trial there; it is done (closed
        # in the search, nothing to continue), not given back.
        _, trainer = fit(SignalledAtBatch4, **kwargs)
        assert [(length, stop) for length, _m, stop, _t in view_of().reports] == [(4, True)]
        assert view_of().state == "stopped"
        return
    with pytest.raises(SystemExit) as stopped:
        fit(SignalledAtBatch4, **kwargs)
    assert stopped.value.code == 0
    # The rung's metric is in the search (not measured later, after the resume), and the trial
    # is given back to be continued from its checkpoint of batch 4.
    assert [(length, stop) for length, _m, stop, _t in view_of().reports] == [(4, False)]
    assert view_of().state == "waiting"
    again = driver.next_trial()
    assert again is not None and again.number == spec.number and again.resumed


class CountsSamples(LinearTrial):
    """Reports `samples` (records trained) with each validation, a time metric of its own."""

    samples = 0

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.samples = (batch_idx + 1) * 8
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {**super().evaluate_batch(batch, batch_idx), "samples": float(self.samples)}


def test_a_time_metric_of_the_trials_own(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    """`time_metric: samples`: the searcher reads each validation's `samples`, as Determined's
    does, and ranks the trial at the rungs it passes (no extra validations are scheduled)."""
    monkeypatch.setitem(SEARCHER_CONFIG, "time_metric", "samples")
    monkeypatch.setitem(SEARCHER_CONFIG, "max_time", 128)
    driver = _driver(tmp_path)
    spec = driver.next_trial()
    assert spec is not None and spec.rungs == (32, 64, 128) and spec.unit == "samples"
    exp_conf = _as_search_trial(tmp_path, monkeypatch, driver, spec)
    fit(
        CountsSamples,
        init_kwargs={"exp_conf": exp_conf},
        max_length=Batch(16),
        validation_period=Batch(5),
        checkpoint_policy="none",
    )
    view = driver.trials()[spec.number]
    assert [(length, stop) for length, _m, stop, _t in view.reports] == [
        (40, False), (80, False), (120, False), (128, True),
    ]  # fmt: skip
    assert sorted(view.rungs) == [0, 1, 2] and view.state == "completed"


def test_a_missing_time_metric_names_it(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    monkeypatch.setitem(SEARCHER_CONFIG, "time_metric", "samples")
    driver = _driver(tmp_path)
    spec = driver.next_trial()
    assert spec is not None
    exp_conf = _as_search_trial(tmp_path, monkeypatch, driver, spec)
    with pytest.raises(Exception, match=r"'samples' \(searcher.time_metric\), but validation"):
        fit(init_kwargs={"exp_conf": exp_conf}, max_length=Batch(4), checkpoint_policy="none")
