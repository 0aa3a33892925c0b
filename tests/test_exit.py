"""The `lightning-bridge` console script exits after its work, whatever threads are left: every
command run as the user runs it (a subprocess with a bound), a thread pool a library leaves
behind, and a thread that never ends (the wait for it is bounded). MLflow's own commands
against a real server are in test_mlflow.py."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from tests import _folders as sf

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ported"
# Every command gets this long; a command that does its work and then waits on a thread
# runs past it.
BOUND_S = 240.0


def bridge(
    *args: str, cwd: pathlib.Path, env: dict[str, str] | None = None, bound: float = BOUND_S
) -> subprocess.CompletedProcess[str]:
    """`lightning-bridge ARGS` to its exit; one still running after `bound` seconds fails."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            sf.console_script(*args),
            cwd=cwd, env=env or sf.cli_env(), capture_output=True, text=True, timeout=bound,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-2000:], (exc.stderr or b"")[-2000:]
        raise AssertionError(f"`lightning-bridge {' '.join(args)}` did not exit: {out}") from None
    print(f"lightning-bridge {' '.join(args)}: {time.monotonic() - started:.1f} s")
    return done


def expect(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def python(code: str, tmp_path: pathlib.Path, env: dict[str, str], bound: float = 60) -> Any:
    """A script in a process of its own, to its exit (a hang fails the test)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    try:
        return subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=bound,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not exit: {exc.stdout!r} {exc.stderr!r}") from None


def test_a_thread_pool_left_behind_does_not_keep_the_command(tmp_path: pathlib.Path) -> None:
    # As MLflow's artifact download does: a pool used and never shut down, its idle workers
    # waiting for work until the interpreter's exit hooks tell them to finish.
    workspace = tmp_path / "workspace"
    done = python(
        f"""
        import concurrent.futures, sys
        pool = concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="LeftBehind")
        print(sorted(pool.map(abs, [-1, -2, -3])))
        from lightning_bridge.experiment.cli._main import command
        sys.argv = ["lightning-bridge", "experiment", "list", "--json",
                    "--workspace", {str(workspace)!r}]
        command()
        """,
        tmp_path,
        sf.cli_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[1, 2, 3]"
    assert json.loads("\n".join(done.stdout.splitlines()[1:])) == []


def test_a_thread_that_never_ends_holds_the_exit_for_the_bound_only(
    tmp_path: pathlib.Path,
) -> None:
    # Python would wait for it forever; the command waits LIGHTNING_BRIDGE_EXIT_WAIT_S, names
    # it, and exits with its own code. A thread marked `wait_at_exit` (a checkpoint being
    # written) is waited for past the bound, and finishes its work.
    written = tmp_path / "written"
    started = time.monotonic()
    done = python(
        f"""
        import pathlib, threading, time
        from lightning_bridge._process import exit_now, wait_at_exit
        threading.Thread(target=time.sleep, args=(3600,), name="Forever").start()
        def write():
            time.sleep(3)
            pathlib.Path({str(written)!r}).write_text("done")
        writer = threading.Thread(target=write, name="checkpoint-writer")
        wait_at_exit(writer)
        writer.start()
        exit_now(5)
        """,
        tmp_path,
        {**sf.cli_env(), "LIGHTNING_BRIDGE_EXIT_WAIT_S": "1"},
    )
    took = time.monotonic() - started
    assert done.returncode == 5, done.stderr
    assert "without waiting for the threads still running: Forever" in done.stderr
    assert "checkpoint-writer" not in done.stderr
    assert written.read_text() == "done"
    assert took < 40, took


@pytest.mark.search
def test_every_command_exits_after_its_work(tmp_path: pathlib.Path) -> None:
    """Each command of `lightning-bridge --help`, as the console script, exits with its code
    after doing its work."""
    workspace = tmp_path / "workspace"
    ws = ["--workspace", str(workspace)]
    expect(bridge("--version", cwd=tmp_path), 0)
    assert "run" in expect(bridge("--help", cwd=tmp_path), 0)

    folder = sf.write_folder(tmp_path / "linear", sf.BASE_CONFIG)
    expect(bridge("run", str(folder), *ws, cwd=tmp_path), 0)
    [experiment] = json.loads(expect(bridge("experiment", "list", "--json", *ws, cwd=tmp_path), 0))
    assert (experiment["id"], experiment["state"]) == (1, "COMPLETED")
    assert "COMPLETED" in expect(bridge("experiment", "describe", "1", *ws, cwd=tmp_path), 0)
    plot = tmp_path / "plot.png"
    expect(bridge("e", "plot", "1", "--out", str(plot), *ws, cwd=tmp_path), 0)
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "nothing to continue" in expect(
        bridge("experiment", "continue", "1", *ws, cwd=tmp_path), 0
    )
    expect(bridge("experiment", "pause", "1", *ws, cwd=tmp_path), 0)
    expect(bridge("experiment", "kill", "1", *ws, cwd=tmp_path), 0)
    assert "Experiment 1, trial 1" in expect(bridge("trial", "logs", "1", *ws, cwd=tmp_path), 0)
    [best] = json.loads(
        expect(bridge("checkpoint", "list", "--best", "--json", *ws, cwd=tmp_path), 0)
    )
    out = tmp_path / "downloaded"
    expect(bridge("checkpoint", "download", best["uuid"], "--out", str(out), *ws, cwd=tmp_path), 0)
    assert sf.same_weights(out, pathlib.Path(best["location"]))
    missing = bridge("trial", "logs", "99", *ws, cwd=tmp_path)
    assert missing.returncode == 2 and "trial 99 not found" in missing.stderr

    # A search, and a worker of it once it is done.
    search = sf.write_folder(
        tmp_path / "search",
        {**sf.SEARCH_CONFIG, "searcher": {"name": "random", "metric": "validation_loss",
                                          "max_trials": 1, "max_length": {"batches": 4}}},
        trial=sf.TINY,
    )  # fmt: skip
    storage = tmp_path / "search.journal"
    started = expect(bridge("run", str(search), "--storage", str(storage), *ws, cwd=tmp_path), 0)
    name = started.split("search-worker ", 1)[1].split()[0]
    expect(bridge("search-worker", name, "--storage", str(storage), *ws, cwd=tmp_path), 0)

    # The model registry's commands against a real MLflow server: test_mlflow.py.
    port = tmp_path / "ported"
    expect(
        bridge(
            "port", "lit_model:LitClassifier", "--datamodule", "data:DigitsDataModule",
            "--out", str(port), cwd=EXAMPLE,
        ),
        0,
    )  # fmt: skip
    assert (port / "model_def.py").is_file() and (port / "const.yaml").is_file()
