"""An experiment's trials as the commands start and continue them: `run` records a new
experiment with one trial (the `single` searcher) and the checkpoint it starts from
(`start_experiment`); `experiment continue ID` runs each unfinished trial again from its latest
checkpoint through its launcher (`continue_experiment`); the checks `run` makes before anything
trains (`check_storage`, `check_code`); the options an experiment records, and the command
that continues it. A trial's own process runs it (`trial_process/_run.py`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shlex
from collections.abc import Callable
from typing import Any

from lightning_bridge import _logging
from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._code import check_size
from lightning_bridge.checkpoint._storage_config import check_backend, storage_from_config
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig, parse_config
from lightning_bridge.experiment.trials._checkpoints import (
    Source,
    fetch,
    resolve_resume,
    settle_checkpoints,
)
from lightning_bridge.experiment.trials._source_checkpoint import warm_start_source
from lightning_bridge.experiment.trials._workdir import run_outputs
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace


def continue_command(workspace: Workspace, experiment_id: int) -> str:
    command = f"lightning-bridge experiment continue {experiment_id}"
    if not workspace.is_default():
        command += f" --workspace {shlex.quote(str(workspace.root))}"
    return command


def check_storage(plan: _plan.Plan) -> None:
    """The configured checkpoint storage is usable: its back end is installed and it takes a
    write (before anything trains)."""
    storage = plan.config.model.checkpoint_storage
    kind = (storage.type if storage is not None else None) or "shared_fs"
    check_backend(kind)
    if kind != "shared_fs" or (storage is not None and storage.host_path):
        section = plan.experiment_config()["checkpoint_storage"]  # host_path made absolute
        storage_from_config(section, plan.context_dir).probe()


def check_code(plan: _plan.Plan, workspace: Workspace, *written: pathlib.Path) -> None:
    """What every checkpoint copies into `code/` fits Determined's bound (before anything
    trains); the workspace, the checkpoint storage and `written` (a search's storage file) are
    never part of it."""
    skipped = run_outputs(plan.context_dir, plan.experiment_config(), workspace.root, *written)
    check_size(plan.context_dir, exclude=skipped)


def options_record(options: _plan.Options) -> dict[str, Any]:
    """The options `experiment continue` repeats (the overrides are in the recorded config)."""
    kept = dataclasses.asdict(options)
    kept.pop("overrides", None)
    kept.pop("resume", None)
    return kept


def start_experiment(
    registry: Registry,
    plan: _plan.Plan,
    config_path: pathlib.Path,
    resume: str | None = None,
) -> tuple[int, _plan.TrialRun]:
    """Record a new experiment with one trial for `plan`; fetch the checkpoint it starts from:
    `--resume`'s (continued), else the searcher's source checkpoint (a warm start)."""
    warm = None
    if resume is not None:
        source = resolve_resume(registry, resume, plan, config_path)
    else:
        found = warm_start_source(registry, plan.config.model.searcher)
        source, warm = (found, True) if found is not None else (Source(""), None)
    conf = plan.config
    config = plan.experiment_config()
    experiment_id = registry.create_experiment(
        config,
        name=conf.name,
        description=conf.description,
        config_path=str(config_path),
        context_dir=str(plan.context_dir),
        options=options_record(plan.options),
        searcher_metric=conf.model.searcher.metric,
        smaller_is_better=conf.model.searcher.smaller_is_better,
    )
    workspace = registry.workspace
    trial = _plan.TrialRun(
        workspace=workspace.root,
        experiment_id=experiment_id,
        trial_id=0,
        trial_dir=workspace.root,
        continue_command=continue_command(workspace, experiment_id),
        warm_start=warm,
    )
    trial.seed = _plan.trial_seed(plan, trial)
    trial.trial_id = registry.create_trial(
        experiment_id,
        hparams=conf.hparams,
        seed=trial.seed,
        source_checkpoint=source.label or None,
    )
    trial.trial_dir = workspace.trial_dir(experiment_id, trial.trial_id)
    if source.checkpoint is not None:
        _logging.configure(trial.log_file)
        local = fetch(registry, source.checkpoint, trial.trial_dir / "restore")
        trial.latest_checkpoint = str(local)
    elif source.directory is not None:
        trial.latest_checkpoint = str(source.directory)
    return experiment_id, trial


def recorded_plan(registry: Registry, experiment_id: int, hparams: dict[str, Any]) -> _plan.Plan:
    """The plan of a recorded experiment (its config as it ran) for one of its trials."""
    experiment = registry.experiment(experiment_id)
    resolved = parse_config(experiment.config)
    config = ResolvedConfig(resolved.raw, resolved.model, resolved.space, hparams)
    folder = pathlib.Path(experiment.context_dir)
    return _plan.prepare_config(config, folder, _plan.Options.from_record(experiment.options))


def continue_experiment(
    registry: Registry,
    experiment_id: int,
    relaunch: bool = False,
    *,
    run: Callable[[Registry, _plan.Plan, _plan.TrialRun, bool], int],
    check: Callable[[_plan.Plan], None] | None = None,
) -> tuple[int, list[int]]:
    """Run each unfinished trial of an experiment from its latest complete checkpoint (from
    the start if it has none), through `run` (its launcher's `run_trial`).
    `check`: the pre-flight, given the first unfinished trial's plan before anything is
    done (it raises to refuse). Returns the exit code and the trials run."""
    registry.reconcile()
    trials = registry.trials(experiment_id)
    registry.experiment(experiment_id)
    running = [t for t in trials if t.state == TrialState.ACTIVE.value]
    if running:
        raise InvalidArgumentError(
            f"experiment {experiment_id}: trial {running[0].id} is still running (process "
            f"{running[0].pid}); stop it first (SIGTERM checkpoints and stops it)."
        )
    unfinished = [t for t in trials if t.state != TrialState.COMPLETED.value]
    if unfinished and check is not None:
        check(recorded_plan(registry, experiment_id, unfinished[0].hparams))
    code = 0
    for recorded in unfinished:
        plan = recorded_plan(registry, experiment_id, recorded.hparams)
        trial = _plan.TrialRun(
            workspace=registry.workspace.root,
            experiment_id=experiment_id,
            trial_id=recorded.id,
            trial_dir=registry.workspace.trial_dir(experiment_id, recorded.id),
            continue_command=continue_command(registry.workspace, experiment_id),
            seed=recorded.seed,
        )
        _logging.configure(trial.log_file)  # the clean-up and download are in the trial's log
        settle_checkpoints(registry, recorded.id)
        latest = registry.latest_checkpoint(recorded.id)
        if latest is not None:
            trial.latest_checkpoint = str(fetch(registry, latest, trial.trial_dir / "restore"))
        elif recorded.source_checkpoint:
            # No checkpoint of its own yet: start again from its source checkpoint, a warm
            # start where the config's searcher named it.
            searcher = plan.config.model.searcher
            if searcher.source_checkpoint_uuid or searcher.source_trial_id:
                trial.warm_start = True
            source = registry.checkpoint(recorded.source_checkpoint)
            if source is not None:
                trial.latest_checkpoint = str(fetch(registry, source, trial.trial_dir / "restore"))
            elif pathlib.Path(recorded.source_checkpoint).is_dir():
                trial.latest_checkpoint = recorded.source_checkpoint
        registry.archive_metrics_after(recorded.id, latest.batches if latest else 0)
        code = run(registry, plan, trial, relaunch)
        if code != 0:
            break
    return code, [t.id for t in unfinished]
