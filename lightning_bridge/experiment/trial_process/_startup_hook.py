"""The experiment folder's `startup-hook.sh`, run before each trial's entrypoint.

As on Determined, bash sources the hook in the context directory with `set -e` (the first
failing command stops it) and `set -x` (each command is echoed), so what it exports reaches
the entrypoint. Its output goes to the trial's log line by line; a failure stops the trial
with the hook's exit code before anything trains. It runs once per trial and machine: the
processes a launcher starts for the other ranks inherit its environment. A Slurm job across
nodes runs it once, in its batch shell before `srun` starts the tasks (`hook_exports`), and
every task gets what it exported from `srun` (`RAN_ENV` tells the task not to run it again).

The hook runs with the bridge's interpreter's folder first on `PATH`, as in an activated
virtual environment: its `python3` and `pip` are the ones the trial runs with, not whichever
come first on the user's `PATH` (the environment it leaves keeps the user's `PATH` unless the
hook changed it).
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from lightning_bridge.experiment.trial_process._child import EntrypointFailed

logger = logging.getLogger("lightning_bridge")

HOOK = "startup-hook.sh"

# Set in a process whose hook already ran for it (a Slurm job's batch shell ran it): the
# process has the hook's environment and does not run it again.
RAN_ENV = "LIGHTNING_BRIDGE_STARTUP_HOOK_RAN"

# Variables bash itself sets in the environment it exports: not the hook's doing.
_SHELL_OWN = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})

_SCRIPT = """
set -e
set -x
source ./{hook}
{{ set +x; }} 2>/dev/null
env -0 > "$1"
"""


def _parse_env(data: bytes) -> dict[str, str]:
    env = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def interpreter_first(path: str | None) -> str:
    """`path` (a `PATH` value) with the folder of this interpreter first, once."""
    folder = os.path.dirname(sys.executable)
    rest = [entry for entry in (path or "").split(os.pathsep) if entry and entry != folder]
    return os.pathsep.join([folder, *rest]) if folder else os.pathsep.join(rest)


def run_startup_hook(context_dir: pathlib.Path, env: Mapping[str, str]) -> dict[str, str] | None:
    """Source `context_dir/startup-hook.sh` (if there is one) under `env`; return the
    environment it leaves (None without a hook). Raises `EntrypointFailed` with the hook's exit
    code when it fails."""
    hook = context_dir / HOOK
    if not hook.is_file():
        return None
    logger.info("Running %s", hook)
    with tempfile.TemporaryDirectory(prefix="lightning-bridge-hook-") as scratch:
        env_file = pathlib.Path(scratch) / "env"
        hook_env = {**env, "PATH": interpreter_first(env.get("PATH"))}
        process = subprocess.Popen(
            ["bash", "-c", _SCRIPT.format(hook=HOOK), "startup-hook", str(env_file)],
            cwd=context_dir,
            env=hook_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert process.stdout is not None
        for raw in process.stdout:
            logger.info("%s: %s", HOOK, raw.decode(errors="replace").rstrip("\n"))
        code = process.wait()
        if code != 0:
            raise EntrypointFailed(
                f"{hook} failed with exit code {code} (its output is in the trial's log above); "
                "the trial did not start. Fix the hook, or remove it if the trial does not "
                "need it.",
                code,
            )
        after = _parse_env(env_file.read_bytes())
    # The interpreter's folder was put first for the hook only: the user's PATH stays, unless
    # the hook itself changed it.
    if after.get("PATH") == hook_env["PATH"]:
        if "PATH" in env:
            after["PATH"] = env["PATH"]
        else:
            after.pop("PATH", None)
    return after


def hook_exports(context_dir: pathlib.Path, env: Mapping[str, str]) -> dict[str, str]:
    """Run the hook (if there is one) under `env`; the variables it set or changed."""
    after = run_startup_hook(context_dir, env)
    if after is None:
        return {}
    return {k: v for k, v in after.items() if k not in _SHELL_OWN and env.get(k) != v}


@contextmanager
def startup_hook_environment(context_dir: pathlib.Path) -> Iterator[None]:
    """Run the hook with this process's environment and apply the variables it exported for
    the duration (the entrypoint, in this process or started from it, sees it); restored after.
    Only the first process of a machine runs it (LOCAL_RANK 0): the others inherit it. Nor does
    a process whose environment the hook already made (`RAN_ENV`)."""
    if int(os.environ.get("LOCAL_RANK", "0") or 0) != 0 or os.environ.get(RAN_ENV):
        yield
        return
    after = run_startup_hook(context_dir, os.environ)
    if after is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in after.items() if k not in _SHELL_OWN})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
