"""Warm trial processes: a forked trial's process is a cold one's (pid, parent, own group,
signals, exit codes, environment, working directory, output file), a crash ends only it, and
a trial whose environment differs from the warm process's starts cold.

The warm process here preloads a small module instead of torch (the same code path, in
milliseconds); the search tests run their trials on warm processes with the real preload.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from lightning_bridge.experiment.launch import _warm
from lightning_bridge.record._registry import Registry

# The trial processes themselves: run once, in the latest Lightning's session.
pytestmark = pytest.mark.processes

# The trial's stand-in: reports what its process looks like, then does what argv[1] says.
PROBE = """
import json, os, random, signal, sys, time
import stateful

what = sys.argv[1]
seen = {
    "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgrp(),
    "cwd": os.getcwd(), "argv": sys.argv, "path0": sys.path[0],
    "env": os.environ.get("PROBE_VALUE"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "worker": os.environ.get("LIGHTNING_BRIDGE_SEARCH_WORKER"),
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "stdin": sys.stdin.read(), "stateful": stateful.VALUE, "random": random.random(),
    "main": __name__,
}
print(json.dumps(seen), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "raise":
    raise RuntimeError("deliberate crash")
if what == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
if what == "wait":
    def stop(signum, frame):
        print("stopping on", signal.Signals(signum).name, flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    # A process of its own (as a rank or a data loader worker would be): its pid is the cue.
    helper = __import__("subprocess").Popen(["sleep", "60"])
    pathlib = __import__("pathlib")
    pathlib.Path(sys.argv[2]).write_text(str(helper.pid))
    time.sleep(60)
"""

# A module the warm process imports, whose state comes from the environment at import time.
STATEFUL = "import os\nVALUE = os.environ.get('PROBE_VALUE')\n"


@pytest.fixture
def folder(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    (code / "stateful.py").write_text(STATEFUL)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(code), path) if p))
    monkeypatch.setenv("PROBE_VALUE", "at-start")
    monkeypatch.delenv(_warm.COLD_ENV, raising=False)
    return code


@pytest.fixture
def starter(folder: pathlib.Path) -> Iterator[_warm.WarmStarter]:
    started = _warm.WarmStarter(preload=("stateful",))
    yield started
    started.close()


def _start(
    starter: _warm.WarmStarter,
    folder: pathlib.Path,
    output: pathlib.Path,
    *args: str,
    **env: str,
) -> _warm.TrialProcess:
    command = [sys.executable, "-m", "probe", *args]
    environment = {**os.environ, "LIGHTNING_BRIDGE_SEARCH_WORKER": str(os.getpid()), **env}
    return starter.start(command, cwd=folder, env=environment, output=str(output))


def _cold_start(
    folder: pathlib.Path, output: pathlib.Path, *args: str, **env: str
) -> _warm.ColdTrial:
    """The trial started as a worker starts it cold (a new interpreter)."""
    environment = {**os.environ, **env}
    with output.open("ab") as out:
        return _warm._cold([sys.executable, "-m", "probe", *args], folder, environment, out)


def _cold(folder: pathlib.Path, output: pathlib.Path, *args: str, **env: str) -> int:
    return _cold_start(folder, output, *args, **env).wait()


def _seen(output: pathlib.Path) -> dict[str, Any]:
    first = output.read_text().splitlines()[0]
    seen: dict[str, Any] = json.loads(first)
    return seen


def test_a_forked_trial_is_a_cold_one(
    starter: _warm.WarmStarter, folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    warm_out, cold_out = tmp_path / "warm.log", tmp_path / "cold.log"
    warm_out.write_text("")  # appended to, as a continued trial's output
    process = _start(starter, folder, warm_out, "exit", "0", CUDA_VISIBLE_DEVICES="1")
    assert isinstance(process, _warm.WarmTrial)  # forked, not started cold
    assert process.wait() == 0
    assert _cold(folder, cold_out, "exit", "0", CUDA_VISIBLE_DEVICES="1") == 0
    warm, cold = _seen(warm_out), _seen(cold_out)
    assert warm["pid"] == process.pid and warm["pid"] != starter._proc.pid  # type: ignore[union-attr]
    # Its parent is the warm process, which the trial follows (named as its worker).
    assert warm["ppid"] == starter._proc.pid  # type: ignore[union-attr]
    assert warm["worker"] == str(warm["ppid"])
    same = ("cwd", "argv", "path0", "env", "cuda", "sigint", "sigterm", "stdin")
    assert {k: warm[k] for k in same} == {k: cold[k] for k in same}
    assert warm["main"] == cold["main"] == "__main__"
    # Each in a process group of its own, not the worker's (a terminal's Ctrl-C goes to the
    # worker, which asks its trials to stop).
    assert warm["pgid"] == warm["pid"] and cold["pgid"] == cold["pid"]
    assert os.getpgrp() not in (warm["pgid"], cold["pgid"])
    assert warm_out.read_text().splitlines()[1:] == cold_out.read_text().splitlines()[1:]


def test_exit_codes_and_crashes_are_a_cold_trial_s(
    starter: _warm.WarmStarter, folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    cases = [(("exit", "3"), 3), (("raise",), 1), (("segfault",), -signal.SIGSEGV)]
    for args, code in cases:
        warm_out, cold_out = tmp_path / f"warm-{args[0]}.log", tmp_path / f"cold-{args[0]}.log"
        process = _start(starter, folder, warm_out, *args)
        assert isinstance(process, _warm.WarmTrial)
        assert process.wait() == code == _cold(folder, cold_out, *args)
        if args[0] == "raise":
            for out in (warm_out, cold_out):
                assert "RuntimeError: deliberate crash" in out.read_text()
                assert "Traceback (most recent call last)" in out.read_text()
    # A crash ended only its trial: the warm process forks the next one.
    after = _start(starter, folder, tmp_path / "after.log", "exit", "0")
    assert isinstance(after, _warm.WarmTrial) and after.wait() == 0


def _helper_pid(ready: pathlib.Path) -> int:
    """The pid the probe's helper process writes once the probe waits for its signal."""
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return int(ready.read_text())


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("start", ["forked", "cold"])
def test_signals_reach_the_trial_and_sigkill_ends_its_processes(
    starter: _warm.WarmStarter, folder: pathlib.Path, tmp_path: pathlib.Path, start: str
) -> None:
    def launch(output: pathlib.Path, ready: pathlib.Path) -> _warm.TrialProcess:
        if start == "cold":
            return _cold_start(folder, output, "wait", str(ready))
        process = _start(starter, folder, output, "wait", str(ready))
        assert isinstance(process, _warm.WarmTrial)
        return process

    ready, output = tmp_path / "ready", tmp_path / "out.log"
    process = launch(output, ready)
    helper = _helper_pid(ready)
    process.send_signal(signal.SIGTERM)  # the trial itself: it stops as it chooses
    assert process.wait() == 0
    assert "stopping on SIGTERM" in output.read_text()
    os.kill(helper, signal.SIGKILL)  # left running by the trial's own exit
    # SIGKILL ends the trial and every process it started (its group), as for a rank that
    # would otherwise wait on a dead peer.
    ready.unlink()
    killed = launch(tmp_path / "killed.log", ready)
    helper = _helper_pid(ready)
    assert os.getpgid(helper) == killed.pid
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    assert _gone(helper)


def test_state_read_at_import_behaves_as_cold(
    starter: _warm.WarmStarter,
    folder: pathlib.Path,
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`stateful` was imported by the warm process with PROBE_VALUE=at-start; a trial whose
    environment says otherwise starts cold and sees its own value, as a cold process does."""
    same = _start(starter, folder, tmp_path / "same.log", "exit", "0")
    assert isinstance(same, _warm.WarmTrial) and same.wait() == 0
    assert _seen(tmp_path / "same.log")["stateful"] == "at-start"
    with caplog.at_level(logging.INFO, logger="lightning_bridge"):
        other = _start(starter, folder, tmp_path / "other.log", "exit", "0", PROBE_VALUE="other")
    assert isinstance(other, _warm.ColdTrial)  # started cold
    assert other.wait() == 0
    assert _seen(tmp_path / "other.log")["stateful"] == "other"
    assert _cold(folder, tmp_path / "cold.log", "exit", "0", PROBE_VALUE="other") == 0
    assert _seen(tmp_path / "cold.log")["stateful"] == "other"
    assert "start cold" in caplog.text and "PROBE_VALUE" in caplog.text
    # The global generators are a new process's: two forked trials draw differently.
    again = _start(starter, folder, tmp_path / "again.log", "exit", "0")
    assert again.wait() == 0
    assert _seen(tmp_path / "again.log")["random"] != _seen(tmp_path / "same.log")["random"]


def test_cold_where_asked_and_when_the_warm_process_is_gone(
    folder: pathlib.Path,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(_warm.COLD_ENV, "1")
    with caplog.at_level(logging.INFO, logger="lightning_bridge"):
        cold = _warm.WarmStarter(preload=("stateful",))
        process = _start(cold, folder, tmp_path / "cold.log", "exit", "4")
    assert isinstance(process, _warm.ColdTrial) and process.wait() == 4
    assert f"start cold (a new interpreter each): {_warm.COLD_ENV} is set" in caplog.text
    monkeypatch.delenv(_warm.COLD_ENV)
    starter = _warm.WarmStarter(preload=("stateful",))
    try:
        starter.warm_up()
        assert starter._proc is not None
        starter._proc.kill()
        starter._proc.wait()
        deadline = time.monotonic() + 10
        while starter._broken is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process = _start(starter, folder, tmp_path / "gone.log", "exit", "5")
        assert isinstance(process, _warm.ColdTrial) and process.wait() == 5
    finally:
        starter.close()


def test_a_failed_preload_starts_trials_cold(
    folder: pathlib.Path, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    starter = _warm.WarmStarter(preload=("no_such_module_here",))
    try:
        with caplog.at_level(logging.INFO, logger="lightning_bridge"):
            process = _start(starter, folder, tmp_path / "out.log", "exit", "6")
            assert process.wait() == 6
        assert "importing no_such_module_here failed" in caplog.text
        assert _seen(tmp_path / "out.log")["ppid"] == os.getpid()  # started by this process
    finally:
        starter.close()


def test_an_optional_preload_missing_still_forks(
    folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    starter = _warm.WarmStarter(preload=("stateful", "?no_such_optional_module"))
    try:
        process = _start(starter, folder, tmp_path / "out.log", "exit", "0")
        assert process.wait() == 0
        assert _seen(tmp_path / "out.log")["ppid"] == starter._proc.pid  # type: ignore[union-attr]
    finally:
        starter.close()


# A preloaded module with an exit handler: it appends the pid of the process that exits.
AT_EXIT = (
    "import atexit, os\n"
    "def _mark():\n"
    "    with open(os.environ['PROBE_AT_EXIT'], 'a') as out:\n"
    "        out.write(f'{os.getpid()}\\n')\n"
    "atexit.register(_mark)\n"
)


def test_the_warm_process_ends_with_its_worker_s_input_running_exit_handlers(
    folder: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed by its worker, the warm process exits with code 0 (skipping only the module
    teardown): what its modules registered to run at exit still runs, in it and in a trial
    it forked."""
    (folder / "at_exit.py").write_text(AT_EXIT)
    marks = tmp_path / "exits.txt"
    monkeypatch.setenv("PROBE_AT_EXIT", str(marks))
    starter = _warm.WarmStarter(preload=("stateful", "at_exit"))
    try:
        process = _start(starter, folder, tmp_path / "out.log", "exit", "0")
        assert process.wait() == 0
        trial = _seen(tmp_path / "out.log")["pid"]
        warm = starter._proc
        assert warm is not None and trial != warm.pid
    finally:
        starter.close()
    assert warm.returncode == 0
    assert sorted(int(line) for line in marks.read_text().split()) == sorted([trial, warm.pid])


def test_a_thread_in_the_warm_process_starts_trials_cold(
    folder: pathlib.Path, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Forking a process with a thread running is unsafe (a lock it holds stays held in the
    child): the warm process refuses, and the trial runs cold, as do the next."""
    (folder / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), name='busy', daemon=True).start()\n"
    )
    starter = _warm.WarmStarter(preload=("stateful", "threaded"))
    try:
        with caplog.at_level(logging.INFO, logger="lightning_bridge"):
            first = _start(starter, folder, tmp_path / "first.log", "exit", "7")
            assert first.wait() == 7
            second = _start(starter, folder, tmp_path / "second.log", "exit", "0")
            assert second.wait() == 0
        assert "cannot fork (a Python thread is running (busy))" in caplog.text
        for name in ("first.log", "second.log"):
            assert _seen(tmp_path / name)["ppid"] == os.getpid()  # started cold, by this process
        assert isinstance(second, _warm.ColdTrial)
    finally:
        starter.close()


# Appended to the search tests' trial: what its process is, and a draw from numpy's global
# generator at import (a module the warm process imported, with state of its own).
PROCESS_PROBE = """
import numpy as _np

_run_dir = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent
(_run_dir / "process.json").write_text(json.dumps({
    "cmdline": pathlib.Path("/proc/self/cmdline").read_bytes().decode(errors="replace"),
    "draw": int(_np.random.randint(1 << 30)),
}))
"""


@pytest.mark.slow
@pytest.mark.search
def test_a_search_s_trials_are_forked_and_draw_as_cold_ones(tmp_path: pathlib.Path) -> None:
    from tests import _folders as sf

    config = {
        **sf.SEARCH_CONFIG,
        "searcher": {
            "name": "random",
            "metric": "validation_loss",
            "max_trials": 3,
            "max_length": {"batches": 2},
            "max_concurrent_trials": 1,
        },
    }
    folder = sf.write_folder(tmp_path, config, "folder", sf.TINY).parent
    model_def = folder / "model_def.py"
    model_def.write_text(model_def.read_text() + PROCESS_PROBE)
    workspace, log = tmp_path / "workspace", tmp_path / "run.log"
    process = sf.start(["run", "search.yaml", "--workspace", str(workspace)], folder, log)
    out = sf.finish_logged(process, log)
    assert process.returncode == 0, out
    assert "start cold" not in out
    seen = [
        json.loads(path.read_text())
        for path in sorted((workspace / "experiments" / "1" / "trials").glob("*/process.json"))
    ]
    assert len(seen) == 3
    # Forked from the warm process (whose command line a forked process keeps).
    assert all("lightning_bridge.experiment.launch._warm" in s["cmdline"] for s in seen), seen
    # numpy's global generator was seeded anew in each, as in a new interpreter.
    assert len({s["draw"] for s in seen}) == 3
    with Registry(workspace) as registry:
        trials = registry.trials(1)
    assert [(t.state, t.batches_trained) for t in trials] == [("COMPLETED", 2)] * 3
