"""Run a Determined experiment folder (config + code) on Lightning.

`prepare()` validates the config and the entrypoint without running anything; `execute()`
runs it. A `module:TrialClass` entrypoint (or the torch_distributed launcher's `--trial`) is
imported and trained in this process with `init()` + `Trainer.fit()`, its lengths and periods
taken from the config. A script entrypoint (`python3 train.py ...`, optionally behind
`python3 -m determined.launch.torch_distributed`) runs as a subprocess, under torchrun when it
gets more than one process, with `determined` mapped onto the bridge and the run described in
`LIGHTNING_BRIDGE_EXPERIMENT` (see `_cluster_info`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import re
import shlex
import shutil
import sys
import tempfile
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract import _cluster_info
from lightning_bridge.contract._trial import is_trial_class
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.experiment import _import_map
from lightning_bridge.experiment._child import ChildRun, run_child
from lightning_bridge.experiment._config import ResolvedConfig, load_config
from lightning_bridge.translation._engine_check import capacity, check_engine

logger = logging.getLogger("lightning_bridge")

_TRIAL_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
# Seconds a script entrypoint gets to stop after SIGTERM / SIGINT (config: preemption_timeout).
DEFAULT_STOP_TIMEOUT = 300
_LAUNCHERS = {
    "determined.launch.torch_distributed": "torch_distributed",
    "determined.launch.horovod": "horovod",
    "determined.launch.deepspeed": "deepspeed",
}


@dataclasses.dataclass
class Options:
    """The `run` command's options."""

    overrides: list[str] = dataclasses.field(default_factory=list)
    test_mode: bool = False
    resume: str | None = None
    devices: Any = None
    precision: str | None = None
    strategy: str | None = None
    accelerator: str | None = None


@dataclasses.dataclass
class Entrypoint:
    """A trial class (`trial="module:Class"`) or a command line (`command`, `python`: whether
    it starts a Python interpreter, `module`: whether it is `python -m ...`)."""

    trial: str | None = None
    command: list[str] = dataclasses.field(default_factory=list)
    python: bool = False


@dataclasses.dataclass
class Plan:
    """A validated run: the config, where it runs and what it runs."""

    config: ResolvedConfig
    context_dir: pathlib.Path
    entrypoint: Entrypoint
    options: Options
    accelerator: str | None = None  # the accelerator Lightning will use (registry name)

    @property
    def processes(self) -> int:
        """How many training processes: `--devices` when it is a number, else slots_per_trial."""
        if isinstance(self.options.devices, int):
            return self.options.devices
        return self.config.model.resources.slots_per_trial

    def checkpoint_dir(self) -> pathlib.Path:
        storage = self.experiment_config().get("checkpoint_storage") or {}
        if storage.get("host_path"):
            return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")
        return self.context_dir / "checkpoints"

    def experiment_config(self) -> dict[str, Any]:
        return self.config.experiment_config(self.context_dir)

    @property
    def stop_timeout(self) -> int:
        """Seconds a script entrypoint gets to stop after a signal before it is killed."""
        return self.config.model.preemption_timeout or DEFAULT_STOP_TIMEOUT


@dataclasses.dataclass
class Result:
    """What a finished run reports: the last validation metrics and the checkpoints."""

    metrics: dict[str, Any] | None
    checkpoint_dir: pathlib.Path
    checkpoints: list[pathlib.Path]


def parse_entrypoint(value: str | list[str] | None) -> Entrypoint:
    """Classify the config's `entrypoint` (see the module docstring)."""
    if value is None:
        raise InvalidArgumentError(
            "entrypoint: required; set it to the trial class (entrypoint: model_def:MyTrial) "
            "or the training command (entrypoint: python3 train.py)"
        )
    argv = shlex.split(value) if isinstance(value, str) else list(value)
    if not argv:
        raise InvalidArgumentError("entrypoint: expected a trial class or a command, got ''")
    if len(argv) == 1 and _TRIAL_SPEC.match(argv[0]):
        return Entrypoint(trial=argv[0])
    if _PYTHON.match(argv[0]) and len(argv) > 2 and argv[1] == "-m" and argv[2] in _LAUNCHERS:
        return _unwrap_launcher(_LAUNCHERS[argv[2]], argv[3:])
    return Entrypoint(command=argv, python=bool(_PYTHON.match(argv[0])))


def _unwrap_launcher(launcher: str, args: list[str]) -> Entrypoint:
    """`python3 -m determined.launch.torch_distributed [launcher args] [--] CMD`: the bridge
    launches CMD itself (torchrun with slots_per_trial processes); `--trial X` is a trial."""
    if launcher != "torch_distributed":
        raise InvalidArgumentError(
            f"entrypoint: determined.launch.{launcher} is not supported (Lightning runs "
            "PyTorch trials with DDP); use python3 -m determined.launch.torch_distributed, or "
            "the training command alone."
        )
    if "--" in args:
        cut = args.index("--")
        launcher_args, command = args[:cut], args[cut + 1 :]
    else:
        launcher_args, command = [], list(args)
        while command and command[0].startswith("-"):
            flag = command.pop(0)
            launcher_args.append(flag)
            if flag == "--trial" and command:
                launcher_args.append(command.pop(0))
        if "--trial" in launcher_args and command:
            launcher_args, command = launcher_args + command, []
    if "--trial" in launcher_args:
        index = launcher_args.index("--trial")
        if index + 1 >= len(launcher_args):
            raise InvalidArgumentError("entrypoint: --trial needs a module:TrialClass")
        others = launcher_args[:index] + launcher_args[index + 2 :]
        if others:
            logger.warning(
                "entrypoint: launcher arguments %s are not used (the bridge launches the "
                "processes)",
                " ".join(others),
            )
        return Entrypoint(trial=launcher_args[index + 1])
    if launcher_args:
        logger.warning(
            "entrypoint: launcher arguments %s are not used (the bridge launches the processes)",
            " ".join(launcher_args),
        )
    if not command:
        raise InvalidArgumentError(
            "entrypoint: determined.launch.torch_distributed needs the training command after "
            "it, e.g. python3 -m determined.launch.torch_distributed python3 train.py"
        )
    return Entrypoint(command=command, python=bool(_PYTHON.match(command[0])))


def prepare(config_path: str | os.PathLike[str], context_dir: Any, options: Options) -> Plan:
    """Load and validate everything a run needs; raise InvalidArgumentError on bad input."""
    config = load_config(config_path, options.overrides)
    config_file = pathlib.Path(config_path).resolve()
    folder = pathlib.Path(context_dir) if context_dir is not None else config_file.parent
    if not folder.is_dir():
        raise InvalidArgumentError(
            f"context directory {str(folder)!r} not found; pass the folder holding the trial "
            "code (the `.` of `det e create const.yaml .`)."
        )
    entrypoint = parse_entrypoint(config.model.entrypoint)
    plan = Plan(config, folder.resolve(), entrypoint, options)
    if entrypoint.trial is not None:
        if plan.config.length("max_length") is None:
            raise InvalidArgumentError(
                "searcher.max_length: required for a trial-class entrypoint (how long to "
                "train), e.g. searcher.max_length.epochs: 5, or --set "
                "searcher.max_length.batches=100"
            )
        # Checks records units (global_batch_size) before anything runs.
        plan.config.length("min_validation_period")
        plan.config.length("min_checkpoint_period")
    if plan.processes < 1:
        raise InvalidArgumentError(f"--devices: expected a positive integer, got {plan.processes}")
    plan.accelerator = check_engine(
        accelerator=options.accelerator or "auto",
        devices=options.devices,
        strategy=options.strategy,
        precision=options.precision,
        spell=lambda name: f"--{name}",
    )
    if options.resume is not None:
        options.resume = str(_resume_checkpoint(plan, options.resume))
    return plan


def _resume_checkpoint(plan: Plan, resume: str) -> pathlib.Path:
    """`--resume`: a checkpoint directory ('latest' and ids resolved), or InvalidArgumentError."""
    from lightning_bridge.checkpoint._layout import LEGACY_STATE_FILES, resolve_checkpoint

    ckpt_dir = plan.checkpoint_dir()
    found = resolve_checkpoint(pathlib.Path(resume).expanduser(), ckpt_dir, option="--resume")
    if not found.is_dir():
        raise InvalidArgumentError(
            f"--resume {resume}: no such checkpoint directory (nor a checkpoint id under "
            f"{ckpt_dir}); pass a checkpoint directory, its id, or 'latest'."
        )
    if not any(found.joinpath(*parts).is_file() for parts in LEGACY_STATE_FILES):
        raise InvalidArgumentError(
            f"--resume {resume}: {found} is not a checkpoint (it holds no state_dict.pth); pass "
            "a checkpoint directory, its id, or 'latest'."
        )
    return found.resolve()


@dataclasses.dataclass
class Oversubscription:
    """More processes than the machine runs side by side: `allowed` for CPU cores (slower, on
    confirmation), never for devices."""

    message: str
    allowed: bool


def oversubscription(plan: Plan) -> Oversubscription | None:
    """Whether the run's processes outnumber the devices (or CPU cores) of this machine."""
    count, kind = capacity(plan.accelerator)
    wanted = plan.processes
    if wanted <= count:
        return None
    source = "--devices" if isinstance(plan.options.devices, int) else "resources.slots_per_trial"
    message = (
        f"{source} asks for {wanted} processes, but this machine has {count} {kind}"
        f"{'s' if count != 1 else ''}"
    )
    return Oversubscription(message, allowed=kind == "CPU core")


def unused_warning(plan: Plan) -> str | None:
    """The one warning listing the config keys the run does not use."""
    unused = plan.config.unused_keys
    if not unused:
        return None
    return "experiment config keys not used by lightning-bridge: " + ", ".join(unused)


def _engine(plan: Plan, processes_launched: bool) -> dict[str, Any]:
    """Engine settings for `init()`: the command line's, plus DDP for several processes when
    Lightning launches them (torchrun-launched scripts are detected by `init()` itself)."""
    opts = plan.options
    engine: dict[str, Any] = {
        "aggregation_frequency": plan.config.model.optimizations.aggregation_frequency
    }
    if opts.accelerator:
        engine["accelerator"] = opts.accelerator
    if opts.precision:
        engine["precision"] = opts.precision
    if opts.strategy:
        engine["strategy"] = opts.strategy
    if not processes_launched:
        if opts.devices is not None:
            engine["devices"] = opts.devices
        elif plan.processes > 1:
            engine["devices"] = plan.processes
        if plan.processes > 1 and not opts.strategy:
            engine["strategy"] = "ddp"
    return engine


def load_trial_class(spec: str, context_dir: pathlib.Path) -> type:
    """Import `module:Class` from the context directory (first on sys.path)."""
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
            "entrypoint names a class derived from pytorch.PyTorchTrial (or use a script "
            "entrypoint such as python3 train.py)."
        )
    return obj


def _run_trial(plan: Plan) -> Result:
    import lightning_bridge as pytorch

    assert plan.entrypoint.trial is not None
    conf = plan.config
    trial_class = load_trial_class(plan.entrypoint.trial, plan.context_dir)
    max_length = conf.length("max_length")
    validation = conf.length("min_validation_period")
    checkpoint = conf.length("min_checkpoint_period")
    engine = _engine(plan, processes_launched=False)
    aggregation = engine.pop("aggregation_frequency")
    with pytorch.init(
        hparams=conf.hparams,
        exp_conf=plan.experiment_config(),
        aggregation_frequency=aggregation,
        checkpoint_dir=plan.checkpoint_dir(),
        run_dir=plan.context_dir,
        **engine,
    ) as context:
        trial = trial_class(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=max_length,
            validation_period=validation,
            checkpoint_period=checkpoint,
            reporting_period=Batch(conf.model.scheduling_unit),
            checkpoint_policy=conf.model.checkpoint_policy,
            latest_checkpoint=plan.options.resume,
            step_zero_validation=conf.model.perform_initial_validation,
            test_mode=plan.options.test_mode,
            profiling_enabled=conf.model.profiling.enabled,
        )
    metrics = getattr(trainer, "last_validation_metrics", None)
    return Result(metrics, plan.checkpoint_dir(), list(trainer.checkpoints))


def _length_record(unit: TrainUnit | None) -> list[Any] | None:
    if unit is None:
        return None
    return ["epochs" if isinstance(unit, Epoch) else "batches", unit.value]


def script_command(plan: Plan) -> list[str]:
    """The command a script entrypoint runs as: this interpreter for `python`, under torchrun
    (`--standalone --nproc_per_node N`, through `_torchrun` so that a stop signal ends the run
    like one process's) for N > 1 processes."""
    command = list(plan.entrypoint.command)
    n = plan.processes
    if not plan.entrypoint.python:
        if n > 1:
            raise InvalidArgumentError(
                f"entrypoint {' '.join(command)}: {n} processes need a Python command to "
                "launch with torchrun (python3 train.py); set resources.slots_per_trial: 1 or "
                "use a python3 entrypoint."
            )
        return command
    if n <= 1:
        return [sys.executable, *command[1:]]
    rest = command[1:]
    torchrun = [sys.executable, "-m", "lightning_bridge.experiment._torchrun"]
    torchrun += [f"--stop-timeout={plan.stop_timeout}", "--", "--standalone"]
    torchrun.append(f"--nproc_per_node={n}")
    if rest and rest[0] == "-m":
        return [*torchrun, "-m", *rest[1:]]
    return [*torchrun, *rest]


def _run_script(plan: Plan) -> tuple[ChildRun, Result]:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="lightning-bridge-run-"))
    try:
        shim = _import_map.shim_dir(workdir)
        results = workdir / "results.json"
        run = {
            "config": plan.experiment_config(),
            "hparams": plan.config.hparams,
            "trial_seed": plan.config.model.reproducibility.experiment_seed or 0,
            "latest_checkpoint": plan.options.resume,  # resolved by prepare()
            "test_mode": plan.options.test_mode,
            "max_length": _length_record(plan.config.length("max_length")),
            "engine": _engine(plan, processes_launched=plan.processes > 1),
            "results": str(results),
        }
        run_file = workdir / "run.json"
        run_file.write_text(json.dumps(run, default=str))
        env = dict(os.environ)
        path = [str(shim), str(plan.context_dir)]
        if env.get("PYTHONPATH"):
            path.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(path)
        env[_cluster_info.ENV_VAR] = str(run_file)
        command = script_command(plan)
        logger.info("Running %s in %s", shlex.join(command), plan.context_dir)
        # Under torchrun the agent enforces the timeout on the workers; the margin is its own.
        margin = 30 if plan.processes > 1 else 0
        try:
            child = run_child(
                command, cwd=plan.context_dir, env=env, timeout=plan.stop_timeout, margin=margin
            )
        except FileNotFoundError as exc:
            raise InvalidArgumentError(
                f"entrypoint: cannot run {command[0]!r} ({exc.strerror}); check the command."
            ) from None
        data: dict[str, Any] = {}
        if results.is_file():
            data = json.loads(results.read_text())
        return child, Result(
            data.get("metrics"),
            plan.checkpoint_dir(),
            [pathlib.Path(p) for p in data.get("checkpoints", [])],
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def execute(plan: Plan) -> tuple[ChildRun, Result]:
    """Run a prepared plan in its context directory; returns how the run ended (a script's
    exit code; 0 for a trial class, whose failures raise) and the result."""
    previous = pathlib.Path.cwd()
    os.chdir(plan.context_dir)
    try:
        if plan.entrypoint.trial is not None:
            return ChildRun(0, 0, False), _run_trial(plan)
        return _run_script(plan)
    finally:
        os.chdir(previous)
