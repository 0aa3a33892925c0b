"""The launcher contract's one loop for a single trial (`Launcher.run_trial`'s default:
`start`, then `launch/_handle.follow`): a launcher that implements only `start`, returning a
handle with `wait` and `send_signal`, runs a trial to its end; the command's first stop
signal pauses the trial, a second kills it, and the trial's end is settled in the record.

The command is a small driver run as a subprocess (its signals are real); its trial is a
process that waits for the test, never for time.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from lightning_bridge.record._registry import Registry

pytestmark = pytest.mark.processes

# The trial's process: says it runs (a file), then, by its mode, ends with a code, stops on
# SIGTERM (exit 0) or ignores SIGTERM (saying so) until it is killed.
TRIAL = """
import pathlib, signal, sys, time
mode, ready = sys.argv[1], pathlib.Path(sys.argv[2])
if mode == "stops":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, lambda *_: ready.with_suffix(".term").write_text("x"))
ready.write_text("x")
if mode.startswith("exit"):
    sys.exit(int(mode[4:]))
while True:
    time.sleep(0.05)
"""

# The command: a launcher of its own (only `start`), the contract's `run_trial` for the rest.
DRIVER = """
import pathlib, sys, types
from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.launch._contract import Launcher
from lightning_bridge.experiment.launch._warm import _cold
from lightning_bridge.record._registry import Registry

workspace, trial_id, mode, ready, trial_code = sys.argv[1:6]

class ProcessLauncher(Launcher):
    name = "process"

    def start(self, registry, plan, trial, devices=()):
        if mode == "refused":
            raise InvalidArgumentError("no room for the trial; add a node")
        with open(pathlib.Path(ready).with_suffix(".log"), "ab") as out:
            command = [sys.executable, "-c", trial_code, mode, ready]
            return _cold(command, ".", dict(__import__("os").environ), out)

with Registry(pathlib.Path(workspace)) as registry:
    trial = types.SimpleNamespace(trial_id=int(trial_id))
    try:
        code = ProcessLauncher().run_trial(registry, None, trial)
    except InvalidArgumentError as exc:
        print(f"refused: {exc}")
        code = 2
sys.exit(code)
"""


def _wait_for(path: pathlib.Path, driver: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if driver.poll() is not None or time.monotonic() > deadline:
            out, err = driver.communicate(timeout=60)
            raise AssertionError(f"{path} never appeared; the command said: {out}{err}")
        time.sleep(0.02)


def _run(tmp_path: pathlib.Path, mode: str, *signals: int) -> tuple[int, str, str, str, str]:
    """The command run on a recorded trial in `mode`, sent `signals` once its trial runs
    (the second once the trial saw the first); its exit code, output, errors, and the trial's
    recorded state and message."""
    workspace = tmp_path / "ws"
    with Registry(workspace) as registry:
        experiment = registry.create_experiment({"name": "x"}, name="x")
        trial_id = registry.create_trial(experiment, hparams={}, seed=0)
        registry.trial_started(trial_id)
    ready = tmp_path / "trial.ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-c", DRIVER, str(workspace), str(trial_id), mode, str(ready)]
    driver = subprocess.Popen(
        [*command, TRIAL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        for number, sig in enumerate(signals):
            _wait_for(ready if number == 0 else ready.with_suffix(".term"), driver)
            driver.send_signal(sig)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    with Registry(workspace) as registry:
        trial = registry.trial(trial_id)
    return driver.returncode, out, err, trial.state, trial.message or ""


def test_a_trial_ending_without_recording_an_end_is_an_error_named_in_one_line(
    tmp_path: pathlib.Path,
) -> None:
    code, out, err, state, message = _run(tmp_path, "exit3")
    assert code == 1
    assert out.startswith("Trial process ") and out.strip().endswith("started")
    assert (state, message) == (
        "ERROR",
        "its process ended (exit code 3) without the trial recording an end",
    )
    assert err.strip().endswith(f"error: trial 1: {message}")


def test_the_first_stop_signal_pauses_the_trial(tmp_path: pathlib.Path) -> None:
    code, out, err, state, message = _run(tmp_path, "stops", signal.SIGTERM)
    assert (code, state, message) == (0, "STOPPED", "stopped"), err
    assert "Pausing trial process " in out and "Killing" not in out


def test_a_second_stop_signal_kills_the_trial(tmp_path: pathlib.Path) -> None:
    code, out, err, state, message = _run(tmp_path, "stubborn", signal.SIGINT, signal.SIGTERM)
    assert (code, state, message) == (0, "STOPPED", "stopped"), err
    pausing, killing = out.index("Pausing trial process "), out.index("Killing trial process ")
    assert pausing < killing


def test_a_refused_start_ends_the_trial_in_error_with_the_refusal(
    tmp_path: pathlib.Path,
) -> None:
    code, out, err, state, message = _run(tmp_path, "refused")
    assert code == 2 and out.strip() == "refused: no room for the trial; add a node", err
    assert (state, message) == ("ERROR", "no room for the trial; add a node")
