"""The config's `entrypoint`: a trial class, or a command (possibly behind Determined's
launcher, which the bridge replaces with its own process launch)."""

from __future__ import annotations

import dataclasses
import logging
import re
import shlex

from lightning_bridge._errors import InvalidArgumentError

logger = logging.getLogger("lightning_bridge")

_TRIAL_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
_LAUNCHERS = {
    "determined.launch.torch_distributed": "torch_distributed",
    "determined.launch.horovod": "horovod",
    "determined.launch.deepspeed": "deepspeed",
}


@dataclasses.dataclass
class Entrypoint:
    """A trial class (`trial="module:Class"`) or a command line (`command`, `python`: whether
    it starts a Python interpreter; `launched`: whether it was behind Determined's
    `torch_distributed` launcher, which starts one process per slot, where a command alone
    runs once per node)."""

    trial: str | None = None
    command: list[str] = dataclasses.field(default_factory=list)
    python: bool = False
    launched: bool = False


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
    """`python3 -m determined.launch.torch_distributed [launcher args] [--] CMD` (or
    `determined.launch.deepspeed`): the bridge launches CMD itself (torchrun with
    slots_per_trial processes; no hostfile or ssh); `--trial X` is a trial."""
    if launcher not in ("torch_distributed", "deepspeed"):
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
            f"entrypoint: determined.launch.{launcher} needs the training command after "
            f"it, e.g. python3 -m determined.launch.{launcher} python3 train.py"
        )
    return Entrypoint(command=command, python=bool(_PYTHON.match(command[0])), launched=True)
