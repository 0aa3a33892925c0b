"""Run one trial of a `Plan` in this process (`execute()`), as the trial's process does.

The trial's run is described in a JSON file in the trial's folder, named by
`LIGHTNING_BRIDGE_EXPERIMENT` (a `RunDescription`): its config, hyperparameters, folders,
engine settings, schedule and record. A `module:TrialClass` entrypoint (or the
torch_distributed launcher's `--trial`) is imported and trained in this process with `init()` +
`Trainer.fit()`, both taking their values from that description. A script entrypoint
(`python3 train.py ...`, optionally behind `python3 -m determined.launch.torch_distributed`)
runs as a subprocess, under torchrun when it gets more than one process, with `determined`
mapped onto the bridge.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import pathlib
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract import _code_import, _import_map
from lightning_bridge.contract._units import Batch
from lightning_bridge.experiment.config._entrypoint import Entrypoint
from lightning_bridge.experiment.config._plan import Plan, TrialRun, trial_seed
from lightning_bridge.experiment.trial_process._child import EntrypointFailed, run_child
from lightning_bridge.experiment.trial_process._environment import (
    configured_environment,
    trial_variables,
)
from lightning_bridge.experiment.trial_process._startup_hook import (
    interpreter_first,
    startup_hook_environment,
)
from lightning_bridge.translation._engine_settings import EngineSettings
from lightning_bridge.translation.services._run_description import (
    ENV_VAR,
    RecordConnection,
    RunDescription,
)

logger = logging.getLogger("lightning_bridge")


def engine_settings(plan: Plan, processes_launched: bool) -> EngineSettings:
    """The trial's engine settings: the command line's, plus DDP for several processes when
    Lightning launches them (torchrun-launched scripts are detected by `init()` itself)."""
    settings = plan.options.engine_settings()
    if processes_launched:
        return settings.replace(devices=None)
    if settings.devices is None and plan.processes > 1:
        settings = settings.replace(devices=plan.processes)
    if plan.processes > 1 and not plan.options.strategy:
        settings = settings.replace(strategy="ddp")
    return settings


# What each of a multi-process DeepSpeedTrial's processes runs (under torchrun).
DEEPSPEED_TRIAL_COMMAND = [
    "python3",
    "-m",
    "lightning_bridge.experiment.trial_process._deepspeed_trial",
]


def _deepspeed_processes(plan: Plan) -> Plan:
    """The plan of a multi-process DeepSpeedTrial: its processes are torchrun's (as behind
    Determined's launcher), each running `DEEPSPEED_TRIAL_COMMAND`."""
    entrypoint = Entrypoint(command=list(DEEPSPEED_TRIAL_COMMAND), python=True, launched=True)
    return dataclasses.replace(plan, entrypoint=entrypoint)


def load_trial_class(spec: str, context_dir: pathlib.Path) -> type:
    """Import `module:Class` from the context directory (first on sys.path)."""
    from lightning_bridge.contract._trial import is_trial_class

    module_name, _, qualname = spec.partition(":")
    if str(context_dir) not in sys.path:
        sys.path.insert(0, str(context_dir))
    _import_map.install(force=False)
    loaded = sys.modules.get(module_name.partition(".")[0])
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(context_dir)):
        # A same-named module of another folder (an earlier run in this process).
        for name in [m for m in sys.modules if m.partition(".")[0] == loaded.__name__]:
            del sys.modules[name]
    if importlib.util.find_spec(module_name) is None:
        raise InvalidArgumentError(
            f"entrypoint {spec}: no module {module_name!r} in {context_dir}; the entrypoint "
            "names a Python file of the context directory (model_def:MyTrial for "
            "model_def.py)."
        )
    # The trial runs from the user's folder in place: nothing is written beside the code, the
    # bytecode of its modules included (Determined ran a copy of the folder).
    with _code_import.without_bytecode():
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise InvalidArgumentError(
                f"entrypoint {spec}: {module_name} has no {qualname!r}; check the class name."
            )
        obj = getattr(obj, part)
    if not is_trial_class(obj):
        raise InvalidTrialError(
            f"entrypoint {spec}: {qualname} is not a PyTorchTrial subclass; a trial-class "
            "entrypoint names a class derived from pytorch.PyTorchTrial or "
            "pytorch.deepspeed.DeepSpeedTrial (or use a script "
            "entrypoint such as python3 train.py)."
        )
    return obj


def _run_trial(plan: Plan, run: RunDescription, work_dir: pathlib.Path) -> None:
    """Train a trial class in this process: `init()` takes everything from the run's
    description (named in the environment), `fit()` its schedule."""
    assert plan.entrypoint.trial is not None
    run_trial_class(load_trial_class(plan.entrypoint.trial, work_dir), run)


def run_trial_class(trial_class: type, run: RunDescription) -> None:
    """Build the trial with its API's `init()` and train it with that API's `Trainer`: a
    `PyTorchTrial` on Lightning, a `DeepSpeedTrial` on DeepSpeed's engine (in the processes
    torchrun started: `_deepspeed_trial`)."""
    fit_arguments: dict[str, Any] = {
        "max_length": run.max_length,
        "validation_period": run.validation_period,
        "checkpoint_period": run.checkpoint_period,
        "reporting_period": Batch(run.reporting_period),
        "checkpoint_policy": run.checkpoint_policy,
        "latest_checkpoint": run.latest_checkpoint,
        "step_zero_validation": run.step_zero_validation,
        "test_mode": run.test_mode,
        "profiling_enabled": run.profiling_enabled,
        "trust_checkpoint": run.trust_checkpoint,
        "warm_start": run.warm_start,
    }
    from lightning_bridge.contract._trial import is_deepspeed_trial_class  # imports torch

    if is_deepspeed_trial_class(trial_class):
        from lightning_bridge.translation.deepspeed import _trainer as det_ds

        with det_ds.init() as ds_context:
            det_ds.Trainer(trial_class(ds_context), ds_context).fit(**fit_arguments)
        return
    import lightning_bridge as pytorch

    with pytorch.init() as context:
        pytorch.Trainer(trial_class(context), context).fit(**fit_arguments)


def torchrun_launched(plan: Plan) -> bool:
    """Whether a script entrypoint's processes are started by a launcher rather than by the
    script (`script_command`): several, behind Determined's launcher or across nodes."""
    many_nodes = (plan.options.num_nodes or 1) > 1
    return plan.processes > 1 and (plan.entrypoint.launched or many_nodes)


def launched_rank() -> bool:
    """Whether this process is already one rank of the trial's processes, started one per
    process by its launcher (a Slurm job's tasks: their environment names their RANK). A
    script entrypoint then runs once here, as that rank, not under a torchrun of its own."""
    return "RANK" in os.environ


def script_command(plan: Plan) -> list[str]:
    """The command a script entrypoint runs as: this interpreter for `python`; under torchrun
    (`--standalone --nproc_per_node N`, through `_torchrun` so that a stop signal ends the run
    like one process's) for N > 1 processes behind Determined's launcher, or on each of
    several nodes; alone where the launcher started each rank; once otherwise, as Determined
    runs a command."""
    command = list(plan.entrypoint.command)
    n = plan.processes
    if not plan.entrypoint.python:
        if n > 1 and plan.entrypoint.launched:
            raise InvalidArgumentError(
                f"entrypoint {' '.join(command)}: {n} processes need a Python command to "
                "launch with torchrun (python3 train.py); set resources.slots_per_trial: 1 or "
                "use a python3 entrypoint."
            )
        return command
    nodes = plan.options.num_nodes or 1
    if n <= 1 or launched_rank() or (not plan.entrypoint.launched and nodes <= 1):
        # As on Determined, a command not behind its launcher runs once on its node, with the
        # node's slots to use: it starts its own processes (a Trainer-API script's, through
        # Lightning's launcher), or trains in one.
        return [sys.executable, *command[1:]]
    rest = command[1:]
    torchrun = [sys.executable, "-m", "lightning_bridge.experiment.trial_process._torchrun"]
    torchrun += [f"--stop-timeout={plan.stop_timeout}", "--"]
    if nodes > 1 and "NODE_RANK" in os.environ and "RANK" not in os.environ:
        # One process per node of a trial across nodes (the Ray launcher's): torchrun starts
        # this node's processes, its rendezvous at rank 0's node.
        torchrun += [
            f"--nnodes={nodes}",
            f"--node_rank={os.environ['NODE_RANK']}",
            f"--master_addr={os.environ.get('MASTER_ADDR', '127.0.0.1')}",
            f"--master_port={os.environ.get('MASTER_PORT', '29500')}",
            f"--nproc_per_node={n // nodes}",
        ]
    else:
        torchrun += ["--standalone", f"--nproc_per_node={n}"]
    if rest and rest[0] == "-m":
        return [*torchrun, "-m", *rest[1:]]
    return [*torchrun, *rest]


def describe_run(plan: Plan, trial: TrialRun) -> RunDescription:
    """The run description a trial's processes read (see `RunDescription`)."""
    conf = plan.config
    script = plan.entrypoint.trial is None
    record = RecordConnection(str(trial.workspace), trial.experiment_id, trial.trial_id)
    return RunDescription(
        record=record,
        run_dir=trial.trial_dir,
        checkpoint_dir=trial.checkpoint_dir,
        log_file=trial.log_file,
        context_dir=plan.context_dir,
        entrypoint=conf.model.entrypoint,
        config=plan.experiment_config(),
        raw_config=conf.raw,
        hparams=conf.hparams,
        trial_seed=trial_seed(plan, trial),
        engine=engine_settings(plan, processes_launched=script and torchrun_launched(plan)),
        aggregation_frequency=conf.model.optimizations.aggregation_frequency,
        max_length=conf.length("max_length"),
        validation_period=conf.length("min_validation_period"),
        checkpoint_period=conf.length("min_checkpoint_period"),
        reporting_period=conf.model.scheduling_unit,
        checkpoint_policy=conf.model.checkpoint_policy,
        step_zero_validation=conf.model.perform_initial_validation,
        profiling_enabled=conf.model.profiling.enabled,
        test_mode=plan.options.test_mode,
        trust_checkpoint=plan.options.trust_checkpoint,
        latest_checkpoint=trial.latest_checkpoint,
        warm_start=trial.warm_start,
        continue_command=trial.continue_command,
        max_restarts=conf.model.max_restarts,
        search=trial.search,
        options=dataclasses.asdict(plan.options),
    )


@contextmanager
def described(
    plan: Plan, trial: TrialRun, started_with: tuple[RunDescription, pathlib.Path] | None = None
) -> Iterator[RunDescription]:
    """Write the trial's run description and name it in this process's environment for the
    duration (processes started meanwhile inherit it). `started_with`: the description this
    process was started with and its file, named as it is (its launcher wrote it)."""
    trial.trial_dir.mkdir(parents=True, exist_ok=True)
    if started_with is None:
        run, run_file = describe_run(plan, trial), trial.run_file
        run.write(run_file)
    else:
        run, run_file = started_with
    previous = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(run_file)
    try:
        yield run
    finally:
        if previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = previous


def _run_script(plan: Plan, trial: TrialRun) -> int:
    shim = _import_map.shim_dir(trial.trial_dir)
    env = dict(os.environ)
    work_dir = trial.working_dir(plan)
    path = [str(shim), str(work_dir)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    # The `python3` the script starts (its own workers) is the interpreter its entrypoint's
    # `python3` became, as a container's python3 is the one Determined runs it with.
    env["PATH"] = interpreter_first(env.get("PATH"))
    command = script_command(plan)
    under_torchrun = torchrun_launched(plan) and not launched_rank()
    if plan.processes > 1 and launched_rank():
        # One rank of a world its launcher started: torchrun's variables, as its ranks see
        # them (the launcher gives RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT).
        env.setdefault("WORLD_SIZE", str(plan.processes))
    logger.info("Running %s in %s", shlex.join(command), work_dir)
    # Under torchrun the agent enforces the timeout on the workers; the margin is its own.
    margin = 30 if under_torchrun else 0
    try:
        ended = run_child(command, cwd=work_dir, env=env, timeout=plan.stop_timeout, margin=margin)
    except FileNotFoundError as exc:
        raise InvalidArgumentError(
            f"entrypoint: cannot run {command[0]!r} ({exc.strerror}); check the command."
        ) from None
    finally:
        shutil.rmtree(shim, ignore_errors=True)
    if ended.killed or ended.code < 0 or (ended.forwarded and ended.code):
        raise EntrypointFailed(ended.describe_failure(plan.stop_timeout), ended.exit_code)
    return ended.code


def execute(
    plan: Plan, trial: TrialRun, started_with: tuple[RunDescription, pathlib.Path] | None = None
) -> int:
    """Run one trial of a prepared plan in its working directory (a search's trial: its own
    copy of the context directory, made by its launcher); returns the exit code (a trial
    class's exceptions propagate). `started_with`: the run description (and its file) this
    process was started with, used as it is rather than described again from the plan."""
    previous = pathlib.Path.cwd()
    work_dir = trial.working_dir(plan)
    variables = trial_variables(plan.config.model.environment, plan.options.accelerator)
    os.chdir(work_dir)
    try:
        with (
            described(plan, trial, started_with) as run,
            configured_environment(variables),
            startup_hook_environment(work_dir),
        ):
            spec = plan.entrypoint.trial
            if spec is not None and plan.processes > 1:
                from lightning_bridge.contract._trial import is_deepspeed_trial_class

                if is_deepspeed_trial_class(load_trial_class(spec, work_dir)):
                    # DeepSpeed's processes are torchrun's, each running the trial class.
                    return _run_script(_deepspeed_processes(plan), trial)
            if spec is not None:
                _run_trial(plan, run, work_dir)
                return 0
            return _run_script(plan, trial)
    finally:
        os.chdir(previous)
