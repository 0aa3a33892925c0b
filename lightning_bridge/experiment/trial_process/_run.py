"""A trial run in its own process, to its end: `lightning-bridge _trial RUN_FILE` (the other
ranks Lightning's launcher starts, a search's trial, a Slurm job's tasks) reads its run
description (`run_from_file`, `run_described`); the chief records the trial's start and end
and applies the experiment's checkpoint retention (`run_trial`, which the local launcher runs
in the command's own process for a single trial). Its metrics and checkpoints are recorded
by the trial's fit itself (`_run_record`).
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import sys

from lightning_bridge import _logging
from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig, parse_config
from lightning_bridge.experiment.trial_process import _execute
from lightning_bridge.experiment.trial_process._parent import follow_parent
from lightning_bridge.experiment.trials._checkpoints import apply_experiment_retention
from lightning_bridge.experiment.trials._workdir import prepare_work_dir
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import is_chief

logger = logging.getLogger("lightning_bridge")


def run_trial(
    registry: Registry,
    plan: _plan.Plan,
    trial: _plan.TrialRun,
    relaunch: bool = False,
    started_with: tuple[RunDescription, pathlib.Path] | None = None,
) -> int:
    """Run one trial; record how it ended unless its process did; return the exit code.

    `relaunch`: this process runs the `lightning-bridge` command itself, whose command line
    Lightning's launcher repeats for the other ranks; they get `_trial RUN_FILE` instead, so
    they train this trial and record nothing new. `started_with`: the run description (and
    its file) this process was started with (`run_described`)."""
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
        _plan.trial_seed(plan, trial),
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
        code = _execute.execute(plan, trial, started_with)
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
    # The plan is rebuilt for what runs the trial (its entrypoint, processes, working copy);
    # the description it came from is what the trial reads, not written again from the plan
    # (its file named as the trial's folder names it, an absolute path).
    named = run_file.resolve()
    if named == trial.run_file.resolve():
        named = trial.run_file
    if not is_chief():
        return _execute.execute(plan, trial, (run, named))
    with Registry(workspace) as registry:
        return run_trial(registry, plan, trial, started_with=(run, named))
