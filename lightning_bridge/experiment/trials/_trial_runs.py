"""Experiments and their trials: what `run`, `experiment continue` and `_trial` do.

`run` records a new experiment with one trial (the `single` searcher) in the workspace's
registry, runs it and prints what it did. `experiment continue ID` runs each unfinished trial of
an experiment again from its latest checkpoint. `run_trial` is one trial's run, whatever
started it: the trial's log file, its state when the run ends, retention across the
experiment. The trial's own process records its metrics and checkpoints (`_run_record`).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shlex
import shutil
import sys
from collections.abc import Callable
from typing import Any

from lightning_bridge import _logging
from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._code import check_size
from lightning_bridge.checkpoint._storage_config import check_backend, storage_from_config
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig, parse_config
from lightning_bridge.experiment.trial_process import _execute
from lightning_bridge.experiment.trial_process._parent import follow_parent
from lightning_bridge.experiment.trial_process._workdir import (
    Synced,
    run_outputs,
    storage_file,
    sync,
)
from lightning_bridge.experiment.trials._checkpoints import (
    Source,
    apply_experiment_retention,
    fetch,
    resolve_resume,
    settle_checkpoints,
)
from lightning_bridge.experiment.trials._source_checkpoint import warm_start_source
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import is_chief

logger = logging.getLogger("lightning_bridge")


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


def prepare_work_dir(plan: _plan.Plan, trial: _plan.TrialRun) -> Synced | None:
    """Make (or bring up to date) a search trial's own copy of the experiment folder, where its
    hook and entrypoint run (`_workdir`); None for a single trial, which runs in the folder."""
    if trial.work_dir is None:
        return None
    written = []
    if trial.search is not None:
        found = storage_file(trial.search.storage)
        if found is not None:
            written.append(found)
    skipped = run_outputs(plan.context_dir, plan.experiment_config(), trial.workspace, *written)
    return sync(plan.context_dir, trial.work_dir, skipped)


def run_trial(
    registry: Registry, plan: _plan.Plan, trial: _plan.TrialRun, relaunch: bool = False
) -> int:
    """Run one trial; record how it ended unless its process did; return the exit code.

    `relaunch`: this process runs the `lightning-bridge` command itself, whose command line
    Lightning's launcher repeats for the other ranks; they get `_trial RUN_FILE` instead, so
    they train this trial and record nothing new."""
    if relaunch:
        sys.argv[:] = [sys.argv[0], "_trial", str(trial.run_file)]
    _logging.configure(trial.log_file)
    logger.info(
        "Experiment %d, trial %d: %s in %s (experiment seed %s, trial seed %d)",
        trial.experiment_id,
        trial.trial_id,
        plan.config.model.entrypoint,
        trial.working_dir(plan),
        plan.config.model.reproducibility.experiment_seed,
        _execute.trial_seed(plan, trial),
    )
    if trial.latest_checkpoint:
        logger.info("Continuing from checkpoint %s", trial.latest_checkpoint)
    ended = False
    try:
        registry.trial_started(trial.trial_id)
        synced = prepare_work_dir(plan, trial)
        if synced is not None:
            logger.info(
                "The trial runs in its own copy of the experiment folder %s: %s (%s)",
                plan.context_dir,
                synced.path,
                synced.describe(),
            )
        code = _execute.execute(plan, trial)
    except KeyboardInterrupt:
        registry.trial_ended(trial.trial_id, TrialState.STOPPED, "interrupted", if_active=True)
        ended = True
        raise
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        _end(registry, trial, code)
        ended = True
        raise
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        registry.trial_ended(trial.trial_id, TrialState.ERROR, message[:2000], if_active=True)
        ended = True
        raise
    finally:
        if ended:
            _logging.close_log_file()
    try:
        _end(registry, trial, code)
    finally:
        _logging.close_log_file()
        # A checkpoint downloaded to continue from is not kept: storage has it.
        shutil.rmtree(trial.trial_dir / "restore", ignore_errors=True)
    return code


def _end(registry: Registry, trial: _plan.TrialRun, code: int) -> None:
    if code == 0:
        registry.trial_ended(trial.trial_id, TrialState.COMPLETED, if_active=True)
    else:
        registry.trial_ended(
            trial.trial_id, TrialState.ERROR, f"the entrypoint exited with code {code}",
            if_active=True,
        )  # fmt: skip
    state = registry.trial(trial.trial_id).state
    if state in (TrialState.COMPLETED.value, TrialState.ERROR.value):
        for uuid in apply_experiment_retention(registry, trial.experiment_id):
            logger.info("Removed checkpoint %s (checkpoint_storage retention)", uuid)


def _options_record(options: _plan.Options) -> dict[str, Any]:
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
        options=_options_record(plan.options),
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
    trial.seed = _execute.trial_seed(plan, trial)
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
    run: Callable[[Registry, _plan.Plan, _plan.TrialRun, bool], int] | None = None,
    check: Callable[[_plan.Plan], None] | None = None,
) -> tuple[int, list[int]]:
    """Run each unfinished trial of an experiment from its latest complete checkpoint (from
    the start if it has none), through `run` (a launcher's; default: on this machine).
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
        code = (run or run_trial)(registry, plan, trial, relaunch)
        if code != 0:
            break
    return code, [t.id for t in unfinished]


def run_from_file(run_file: pathlib.Path) -> int:
    """One trial from its run description alone (`lightning-bridge _trial RUN_FILE`): the
    other ranks Lightning's launcher starts, or a trial a searcher starts as a subprocess. The
    chief records how it ended; other ranks only train."""
    return run_described(RunDescription.read(run_file), run_file)


def run_described(run: RunDescription, run_file: pathlib.Path) -> int:
    """`run_from_file` for a description its caller has read already (a Slurm job reads its
    run file once and passes it on); `run_file` names it in messages."""
    follow_parent()  # a search's trial stops with the worker that started it
    if run.record is None or run.run_dir is None or run.context_dir is None:
        raise InvalidArgumentError(
            f"{run_file}: a trial's run description names its record, folder and code; this "
            "one does not (write it with `lightning-bridge run`)."
        )
    resolved = parse_config(run.raw_config)
    config = ResolvedConfig(resolved.raw, resolved.model, resolved.space, run.hparams)
    plan = _plan.prepare_config(config, run.context_dir, _plan.Options.from_record(run.options))
    workspace = Workspace(run.record.workspace)
    trial = _plan.TrialRun(
        workspace=workspace.root,
        experiment_id=run.record.experiment_id,
        trial_id=run.record.trial_id,
        trial_dir=run.run_dir,
        latest_checkpoint=run.latest_checkpoint,
        continue_command=run.continue_command,
        warm_start=run.warm_start,
        seed=run.trial_seed,
        search=run.search,
    )
    if not is_chief():
        return _execute.execute(plan, trial)
    with Registry(workspace) as registry:
        return run_trial(registry, plan, trial)
