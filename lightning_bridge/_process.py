"""Whether a process of this machine is still running (how the record and the search tell
a crashed trial or worker, its pid gone, from a live one), how long this one has run, and
how it exits at once."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def seconds_running() -> float | None:
    """Seconds since this process started (its fork: a forked trial's own start), from
    Linux's process start time; None where /proc does not say."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# How long `exit_now` waits, in all, for the threads a library or the user's code left
# running (`LIGHTNING_BRIDGE_EXIT_WAIT_S`); threads given to `wait_at_exit` are waited for
# without bound.
EXIT_WAIT_S = 30.0
_WAITED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def wait_at_exit(thread: threading.Thread) -> None:
    """Have `exit_now` wait for `thread` however long it takes (a checkpoint being written),
    not only for the bounded wait it gives the other threads left running."""
    _WAITED.add(thread)


def _exit_wait_s() -> float:
    try:
        return max(0.0, float(os.environ.get("LIGHTNING_BRIDGE_EXIT_WAIT_S", EXIT_WAIT_S)))
    except ValueError:
        return EXIT_WAIT_S


def _finish_threads() -> None:
    """What the interpreter's `threading._shutdown()` does before `atexit`, with a bound: the
    hooks registered with `threading._register_atexit` first (they tell `concurrent.futures`'
    idle pool threads to finish, as MLflow's download pools need), then join the non-daemon
    threads; those still running after `LIGHTNING_BRIDGE_EXIT_WAIT_S` seconds are named on
    stderr and left to the process exit."""
    if getattr(threading, "_SHUTTING_DOWN", False):
        return
    threading._SHUTTING_DOWN = True  # type: ignore[attr-defined]  # no new pool after this
    for hook in reversed(list(getattr(threading, "_threading_atexits", []))):
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - one hook's failure does not keep the others
            print(f"lightning-bridge: a thread pool's exit hook failed: {exc!r}", file=sys.stderr)
    deadline = time.monotonic() + _exit_wait_s()
    left = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        if thread in _WAITED:
            thread.join()
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        print(
            f"lightning-bridge: exiting after {_exit_wait_s():g} s without waiting for the "
            f"threads still running: {', '.join(left)} (LIGHTNING_BRIDGE_EXIT_WAIT_S sets the "
            "wait)",
            file=sys.stderr,
        )


def exit_now(code: int) -> None:
    """Exit as the interpreter would (thread pools told to finish, non-daemon threads
    joined, `atexit` handlers run, output flushed) but without tearing down every module:
    with torch and Lightning loaded that teardown alone took 0.5 s on a quiet machine and 20 s
    on a loaded one, after the trial had ended. Unlike the interpreter, a thread that never
    ends does not keep the process: the wait for it is bounded (`_finish_threads`)."""
    try:
        _finish_threads()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code & 0xFF if code >= 0 else 1)
