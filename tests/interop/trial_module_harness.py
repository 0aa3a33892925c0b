"""Run a parity scenario as a ``TrialModule`` in a ``lightning.Trainer``.

``run_trial_module`` is ``harness.run_trial`` with the fit replaced by what a Lightning user
writes: the trial wrapped in ``lightning_bridge.TrialModule`` and handed to a
``lightning.Trainer`` whose arguments express the scenario's ``fit(...)`` (see
``TRAINER_SCHEDULES`` and docs/trialmodule.md's table), followed by ``trainer.validate`` where
Determined validates once more at the end of training.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import lightning.pytorch as pl

import lightning_bridge

from .harness import RunRecord, final_state, isolated_environment, run_record, seed_everything
from .recording import Recorder
from .trials import SCENARIOS, Scenario

QUIET = {
    "enable_checkpointing": False,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "accelerator": "cpu",
    "devices": 1,
}

# Each scenario's fit(...) as lightning.Trainer arguments: max_length in epochs ->
# max_epochs; in batches -> max_steps (optimizer steps under manual optimization: one per
# batch here); validation_period in batches -> val_check_interval=N with
# check_val_every_n_epoch=None, in epochs -> check_val_every_n_epoch=N; reporting_period in
# batches -> log_every_n_steps. `final_validation`: Determined validates once more where
# training ends unless the last validation is current; the Lightning user calls
# trainer.validate(module) for it. Not here: `full_dataset` (a list of validation batches and
# step_zero_validation have no Trainer argument), `aggregation3` (its last batches only
# accumulate, and max_steps counts optimizer steps), `test_mode` (a TrialModule argument).
TRAINER_SCHEDULES: dict[str, dict[str, Any]] = {
    # 3 epochs of 6 batches; validation every 4 batches (and at the end: 18); reports every 5.
    "sgd_dropout": {
        "trainer": {
            "max_epochs": 3,
            "val_check_interval": 4,
            "check_val_every_n_epoch": None,
            "log_every_n_steps": 5,
        },
        "final_validation": True,
    },
    # 3 epochs of 7 batches, aggregation_frequency=2; validation every epoch.
    "two_models": {
        "trainer": {"max_epochs": 3, "check_val_every_n_epoch": 1, "log_every_n_steps": 3},
        "final_validation": False,
    },
    # A stop asked for after batch 10 ends training at the next boundary (batch 12, a
    # validation); 10 epochs of 5 batches otherwise.
    "stop_requested": {
        "trainer": {
            "max_epochs": 10,
            "val_check_interval": 6,
            "check_val_every_n_epoch": None,
            "log_every_n_steps": 4,
        },
        "final_validation": True,
    },
    # 14 batches (one optimizer, a step every batch); validation every 6 (and at 14).
    "reducers": {
        "trainer": {
            "max_steps": 14,
            "val_check_interval": 6,
            "check_val_every_n_epoch": None,
            "log_every_n_steps": 4,
        },
        "final_validation": True,
    },
}


def run_trial_module(scenario: Scenario | str, workdir: str | os.PathLike[str]) -> RunRecord:
    """Run ``scenario`` as a TrialModule in a lightning.Trainer; record what the trial saw."""
    if isinstance(scenario, str):
        scenario = SCENARIOS[scenario]
    schedule = TRAINER_SCHEDULES[scenario.name]
    pytorch = lightning_bridge
    workdir = pathlib.Path(workdir)
    recorder = Recorder()
    trial_cls = scenario.make_trial(pytorch, recorder)
    init_kwargs = dict(scenario.init_kwargs)
    init_kwargs["trainer_kwargs"] = {"enable_progress_bar": False, "enable_model_summary": False}
    with isolated_environment(workdir):
        seed_everything(scenario.seed)
        with pytorch.init(
            hparams=dict(scenario.hparams),
            exp_conf=None if scenario.exp_conf is None else dict(scenario.exp_conf),
            **init_kwargs,
        ) as context:
            trial = trial_cls(context)
            module = pytorch.TrialModule(trial, context)
            trainer = pl.Trainer(**QUIET, **schedule["trainer"])
            trainer.fit(module)
            if schedule["final_validation"] and not module.state.validation_is_current:
                trainer.validate(module, verbose=False)
            weights, final_lrs = final_state(trial)
        return run_record(
            "lightning_bridge.TrialModule", scenario.name, recorder, weights, final_lrs
        )
