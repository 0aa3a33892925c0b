"""Warm trial processes: a search's trials forked from a process that has already imported
Python, torch, Lightning and the bridge, instead of each importing them again.

A worker's `WarmStarter` keeps one such process (the *warm process*,
`python -m lightning_bridge.experiment.launch._warm`). It imports what a trial imports,
then waits for requests on its stdin: each names a `python -m MODULE ARGS` command, its working
directory, environment and output file. It forks; the child sets these up as a fresh
interpreter would have them and runs the module as `python -m` does (`runpy`), then exits
with its code. A trial therefore costs a fork (milliseconds) instead of ~4 s of imports
(and their CPU, which a 2-core machine running two trials does not have to spare).

Why fork from one warm process rather than reuse a pool of processes that run trial after
trial: a forked child starts from the same clean state every time (no state left behind by
an earlier trial), its memory is its own (copy-on-write: a forked trial resides in no more
memory than a cold one), and a crash ends only it. A pre-started pool hides the import's wall
time but still spends its CPU once per trial.

What a forked trial shares with a cold one (`ColdTrial`, the same command as a new
interpreter): its own pid and its own process group (a terminal's Ctrl-C reaches the worker,
which asks each trial to checkpoint and stop; SIGKILL ends a trial's whole group, its other
ranks and data loader workers with it), signal dispositions reset to Python's defaults, stdin
from /dev/null, stdout and stderr appended to its output file, its environment, working
directory, `sys.argv`, `sys.path[0]`, fresh `random` / numpy global seeds and
`CUDA_VISIBLE_DEVICES`. It stops with the worker as a cold one does (the warm process
dies with the worker, and the trial follows its parent, see `_parent`).

A trial starts cold, with a log line saying why, when forking is not safe or would not give
what a cold process gets: no `os.fork` (not Linux), `LIGHTNING_BRIDGE_COLD_TRIALS=1`, the
warm process has CUDA initialised or a Python thread running, its imports failed, it died,
or the trial's environment differs from the warm process's in a variable other than the
per-trial ones (a module imported in the warm process may have read it at import).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from lightning_bridge._process import exit_now, pid_alive
from lightning_bridge.experiment.launch._handle import TrialProcess

logger = logging.getLogger("lightning_bridge")

COLD_ENV = "LIGHTNING_BRIDGE_COLD_TRIALS"
# Per-trial variables: read by the bridge when the trial starts, never at import time.
PER_TRIAL_ENV = frozenset(
    {
        "LIGHTNING_BRIDGE_EXPERIMENT",
        "LIGHTNING_BRIDGE_SEARCH_WORKER",
        "CUDA_VISIBLE_DEVICES",
        # What a launcher tells the trial's process of its run (`_trial_environment`).
        "LIGHTNING_BRIDGE_TRIAL_ENVIRONMENT",
        "LIGHTNING_BRIDGE_NODE_ADDRS",
    }
)
# What a trial's process imports before its first batch (a name missing here is imported by
# the trial itself, as in a cold process), in two parts. What every trial process imports: the
# command, the record and the search it reports to (a script entrypoint's process starts the
# script, which imports what it needs, and records how it ended).
SCRIPT_PRELOAD = (
    "lightning_bridge.experiment.cli._main",
    "lightning_bridge.experiment.trial_process._run",
    "lightning_bridge.translation.services._search_report",
    "lightning_bridge.search._driver",
    "optuna",
    "lightning_bridge.record._registry",
    "sqlalchemy.dialects.sqlite",
)
# What only a trial trained in the process itself imports.
FIT_PRELOAD = (
    "numpy",
    "torch",
    "lightning.fabric",
    "lightning_bridge.translation.fit._init",
    "lightning_bridge.translation.fit._trainer_api",
    # Optional: Lightning's TensorBoard logger imports every installed object-storage file
    # system when it saves, at the end of each trial (0.7 s quiet, 6 s loaded for s3fs).
    "?s3fs",
    "?gcsfs",
    "?adlfs",
)
PRELOAD = FIT_PRELOAD + SCRIPT_PRELOAD
# What a trial's MLflow mirror imports (its first send, at the latest at the trial's end: a
# cold import of MLflow's client takes 4-8 s), preloaded when the record is mirrored.
MIRROR_PRELOAD = ("?mlflow", "?mlflow.tracking", "lightning_bridge.tracking._mirror")


def preload_for(script: bool, mirrored: bool) -> tuple[str, ...]:
    """What the warm process imports for a search's trials: a trial class's (with the MLflow
    mirror's client when the record is mirrored), or a script entrypoint's, whose trial
    process trains nothing itself (importing torch and Lightning there would cost each
    search seconds of CPU for nothing)."""
    if script:
        return SCRIPT_PRELOAD
    return PRELOAD + (MIRROR_PRELOAD if mirrored else ())


_PR_SET_PDEATHSIG = 1


class WarmTrial(TrialProcess):
    """A trial forked by the warm process: a `Popen`-like handle (pid, wait, poll,
    send_signal); its exit code comes from the warm process, which reaps it."""

    def __init__(self, cold: Callable[[], ColdTrial]) -> None:
        self._cold = cold  # how to start it cold, should the warm process refuse
        self._pid: int | None = None
        self.returncode: int | None = None
        self._started = threading.Event()
        self._ended = threading.Event()
        self._pending: list[int] = []
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        self._started.wait()
        assert self._pid is not None
        return self._pid

    def _set_pid(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            pending, self._pending = self._pending, []
        self._started.set()
        for sig in pending:
            self.send_signal(sig)

    def _go_cold(self) -> None:
        """Refused by the warm process: started cold instead, this handle following it."""
        process = self._cold()
        self._set_pid(process.pid)
        threading.Thread(target=lambda: self._set_code(process.wait()), daemon=True).start()

    def _set_code(self, code: int) -> None:
        self.returncode = code
        self._started.set()
        self._ended.set()

    def wait(self) -> int:
        self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the trial (held until it is forked; nothing once it has ended); SIGKILL
        ends its process group."""
        with self._lock:
            if self._pid is None:
                self._pending.append(sig)
                return
        if self.returncode is None:
            _signal_trial(self._pid, sig)


class ColdTrial(TrialProcess):
    """A trial started as a new interpreter (`process`), in a process group of its own (as a
    forked one); SIGKILL ends the group."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait(self) -> int:
        return self._process.wait()

    def poll(self) -> int | None:
        return self._process.poll()

    def send_signal(self, sig: int) -> None:
        if self._process.poll() is None:
            _signal_trial(self._process.pid, sig)


def _signal_trial(pid: int, sig: int) -> None:
    """SIGKILL: the trial's whole process group (its other ranks, its data loader workers,
    which would otherwise wait on a dead peer); other signals: the trial's own process, which
    stops its ranks together (`StopRequest`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGKILL:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _cold(command: Sequence[str], cwd: Any, env: Mapping[str, str], output: IO[bytes]) -> ColdTrial:
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        process_group=0,
    )
    return ColdTrial(process)


# How long a worker waits for its warm process's imports before it pulls trials anyway (they
# then wait in the warm process's queue, as when no worker waits).
READY_WAIT_S = 120.0


def fork_unavailable() -> str | None:
    """Why this machine starts trials cold, or None."""
    if os.environ.get(COLD_ENV, "") not in ("", "0"):
        return f"{COLD_ENV} is set"
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return f"this platform ({sys.platform}) has no safe fork"
    return None


class WarmStarter:
    """Starts a worker's trial processes: forked from one warm process where it is safe,
    else as a new interpreter (`ColdTrial`). One per worker; `close()` ends the warm process."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self.preload = tuple(preload)
        self._proc: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] = {}
        self._trials: dict[int, WarmTrial] = {}  # request id -> trial, until it ends
        self._next_id = 0
        self._lock = threading.Lock()
        self._broken: str | None = fork_unavailable()
        self._said: set[str] = set()
        self._ready = threading.Event()  # the warm process has imported what it preloads
        self._started_at = 0.0

    def _say_cold(self, why: str) -> None:
        if why not in self._said:
            self._said.add(why)
            logger.info("Trial processes start cold (a new interpreter each): %s", why)

    def warm_up(self) -> None:
        """Start the warm process now (its imports overlap the worker's own start)."""
        self._ensure()

    def ready(self) -> bool:
        """Whether a trial started now starts at once: the warm process has done its imports
        (or trials start cold). A worker pulls its first trial then, so that a trial does
        not wait in a worker still importing while another worker could start it."""
        if self._proc is None or self._broken is not None or self._ready.is_set():
            return True
        return time.monotonic() - self._started_at > READY_WAIT_S  # imports that hang

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        if self._broken is not None:
            return None
        if self._proc is None:
            self._env = {k: v for k, v in os.environ.items() if k not in PER_TRIAL_ENV}
            command = [sys.executable, "-m", __name__, str(os.getpid()), *self.preload]
            self._proc = subprocess.Popen(
                command, env=self._env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            self._started_at = time.monotonic()
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    def start(
        self, command: Sequence[str], *, cwd: Any, env: Mapping[str, str], output: str
    ) -> TrialProcess:
        """Start `command` (output appended to the file `output`): forked when it is a
        `python -m MODULE ...` command of this interpreter and forking is safe, else cold."""
        env = dict(env)
        why = None
        if len(command) < 3 or command[0] != sys.executable or command[1] != "-m":
            why = "not a `python -m` command"
        proc = self._ensure() if why is None else None
        if why is None and proc is None:
            why = self._broken
        if why is None:
            differ = sorted(
                k
                for k in (self._env.keys() | env.keys()) - PER_TRIAL_ENV
                if self._env.get(k) != env.get(k)
            )
            if differ:
                why = (
                    f"the trial's environment differs from the warm process's in "
                    f"{', '.join(differ)}, which its imported modules may have read"
                )
        if why is not None or proc is None:
            self._say_cold(why or "no warm process")
            with open(output, "ab") as out:
                return _cold(command, cwd, env, out)

        def cold() -> ColdTrial:
            with open(output, "ab") as out:
                return _cold(command, cwd, env, out)

        trial = WarmTrial(cold)
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            self._trials[request_id] = trial
        request = {
            "id": request_id,
            "module": command[2],
            "argv": list(command[3:]),
            "cwd": str(cwd),
            "env": env,
            "output": str(output),
        }
        try:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            with self._lock:
                self._trials.pop(request_id, None)
            self._broken = "the warm process ended"
            self._say_cold(self._broken)
            return cold()
        return trial

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """The warm process's answers: a trial's pid, its exit code, or a refusal."""
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if "ready" in message:
                self._ready.set()
                continue
            with self._lock:
                trial = self._trials.get(message["id"])
                if "code" in message or "refused" in message:
                    self._trials.pop(message["id"], None)
            if trial is None:
                continue
            if "code" in message:
                trial._set_code(int(message["code"]))
            elif "pid" in message:
                trial._set_pid(int(message["pid"]))
            elif "refused" in message:
                if self._broken is None:
                    self._broken = str(message["refused"])
                    logger.warning(
                        "The warm process cannot fork (%s); this trial and the next start cold",
                        self._broken,
                    )
                trial._go_cold()
        self._lost(proc)

    def _lost(self, proc: subprocess.Popen[bytes]) -> None:
        """The warm process ended: its trials (told by SIGTERM, see `_parent`) are waited
        for; their exit codes are unknown (1)."""
        proc.wait()
        if self._broken is None:
            self._broken = f"the warm process ended with code {proc.returncode}"
        with self._lock:
            left = list(self._trials.values())
            self._trials.clear()
        for trial in left:
            pid = trial._pid
            while pid is not None and pid_alive(pid):
                time.sleep(0.1)
            if trial.returncode is None:
                trial._set_code(1)

    def close(self) -> None:
        """End the warm process (its stdin closed: it exits at once)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----- the warm process -----


def _unsafe() -> str | None:
    """Why forking this process now would not be safe, or None."""
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"a Python thread is running ({names})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in it"
    return None


# The signal dispositions this process started with (the worker's, through exec): a forked
# trial gets them back, as a trial the worker started itself would have.
_INHERITED: dict[signal.Signals, Any] = {}


def _inherited_signals() -> dict[signal.Signals, Any]:
    """SIGINT as Python set it up at start (its handler, or SIG_IGN where the worker ignored
    it), the others SIG_DFL unless ignored."""
    found: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        now = signal.getsignal(sig)
        if sig == signal.SIGINT:
            found[sig] = now if now is signal.SIG_IGN else signal.default_int_handler
        else:
            found[sig] = signal.SIG_IGN if now is signal.SIG_IGN else signal.SIG_DFL
    return found


def _child(request: dict[str, Any], wakeup: tuple[int, int]) -> None:
    """In the forked child: become the trial's process (see the module docstring) and run its
    module as `python -m` does; never returns."""
    code = 1
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # its own process group, as a cold trial's (see the docstring)
        signal.set_wakeup_fd(-1)
        for fd in wakeup:
            os.close(fd)
        # What a new interpreter started by the worker would have: its ignored signals stay
        # ignored (an exec keeps SIG_IGN), the others are the defaults.
        for sig, inherited in _INHERITED.items():
            signal.signal(sig, inherited)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        env = dict(request["env"])
        env["LIGHTNING_BRIDGE_SEARCH_WORKER"] = str(os.getppid())  # this trial's parent
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()
        sys.argv[:] = [request["module"], *request["argv"]]
        _fresh_seeds()
        import importlib
        import runpy

        importlib.invalidate_caches()  # files written since the warm process started
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - the trial's own error, printed as Python would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        exit_now(code)


def _fresh_seeds() -> None:
    """The global generators a new interpreter seeds from the OS (`random` is reseeded by
    Python itself at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _follow(parent: int) -> None:
    """Die with the worker (SIGKILL: the trials then stop by SIGTERM, see `_parent`)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def serve(parent: int, preload: Sequence[str]) -> None:
    """The warm process: import `preload`, then fork a trial per request line on stdin,
    answering its pid and, once reaped, its exit code on stdout; exit at stdin's end (a name
    of `preload` starting with `?` is imported only where it is installed)."""
    import importlib
    import importlib.util

    _follow(parent)
    _INHERITED.update(_inherited_signals())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides what its trials get
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything an import prints goes to stderr, not into the answers

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")

    failed = None
    for name in preload:
        optional = name.startswith("?")
        name = name.removeprefix("?")
        try:
            if optional and importlib.util.find_spec(name) is None:
                continue
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the trials import it themselves, cold
            if not optional:
                failed = f"importing {name} failed ({type(exc).__name__}: {exc})"
                break
    orm = sys.modules.get("sqlalchemy.orm")
    if failed is None and orm is not None:
        orm.configure_mappers()  # the record's mappers, set up once rather than per trial
    answer({"ready": True})
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    import select

    pending = b""
    children: dict[int, int] = {}  # pid -> request id
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            answer({"id": children.pop(pid), "pid": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            # The worker is done (its trials have ended, or follow it). Exit without the
            # interpreter's teardown of torch and Lightning: 3.5 s at a search's end, for a
            # process that has nothing left to write or release.
            exit_now(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            refused = failed or _unsafe()
            if refused:
                answer({"id": request["id"], "refused": refused})
                continue
            sys.stdout.flush()  # nothing of the warm process's own is left for the child to write
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                answers.close()
                _child(request, (wake_r, wake_w))
            with contextlib.suppress(OSError):  # set on both sides: no signal races it
                os.setpgid(pid, pid)
            children[pid] = request["id"]
            answer({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
