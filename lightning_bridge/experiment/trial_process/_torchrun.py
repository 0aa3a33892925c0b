"""torchrun for script entrypoints, ending on SIGTERM / SIGINT the way one process does.

    python -m lightning_bridge.experiment.trial_process._torchrun --stop-timeout=S -- ARGS...

torchrun's agent turns SIGTERM and SIGINT into an exception: it passes the signal to the
workers, waits for them and then exits 1 with a traceback, also when every worker
checkpointed and exited 0. Here the agent (torchrun's own, in this process) passes the signal
on and keeps monitoring: workers on the bridge agree on a batch, checkpoint and exit 0, and
the agent ends as after any successful run. Workers still running S seconds after the first
signal are killed through the agent's own shutdown. A failed worker ends the run with
torchrun's failure report (without a traceback of this process) and the worker's exit code.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

_FORWARDED = (signal.SIGTERM, signal.SIGINT)


class _Agent:
    """Signal handling around torchrun's agent in this process."""

    def __init__(self, stop_timeout: float) -> None:
        from torch.distributed.elastic.multiprocessing import api

        self._api = api
        self._timeout = stop_timeout
        self._contexts: list[Any] = []
        self.signal = 0
        self.timed_out = False

    def patch(self) -> None:
        """Take over SIGTERM / SIGINT once the agent has started the workers (it installs
        its own handlers when it starts them)."""
        original = getattr(getattr(self._api, "PContext", None), "start", None)
        if original is None:  # a torch without it: torchrun's own signal handling stays
            return
        agent = self

        def start(context: Any) -> None:
            original(context)
            agent._contexts.append(context)
            for sig in _FORWARDED:
                signal.signal(sig, agent._forward)
            signal.signal(signal.SIGALRM, agent._give_up)

        self._api.PContext.start = start  # type: ignore[method-assign,assignment]

    def _forward(self, signum: int, frame: Any) -> None:
        if not self.signal:
            self.signal = signum
            signal.alarm(max(1, int(round(self._timeout))))
        for context in self._contexts[-1:]:
            for pid in context.pids().values():
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def _give_up(self, signum: int, frame: Any) -> None:
        # The agent's shutdown path: it kills the workers and re-raises this.
        self.timed_out = True
        raise self._api.SignalException(
            f"workers still running {self._timeout:g} s after the stop signal", signal.SIGKILL
        )


def _split(argv: Sequence[str]) -> tuple[float, list[str]]:
    args = list(argv)
    timeout = 300.0
    while args and args[0] != "--":
        flag = args.pop(0)
        if flag.startswith("--stop-timeout="):
            timeout = float(flag.partition("=")[2])
    return timeout, args[1:] if args else []


def main(argv: Sequence[str] | None = None) -> int:
    timeout, torchrun_args = _split(sys.argv[1:] if argv is None else argv)
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    agent = _Agent(timeout)
    agent.patch()
    try:
        torchrun.run(torchrun.parse_args(torchrun_args))
    except ChildFailedError as exc:
        print(exc, file=sys.stderr, flush=True)
        codes = [f.exitcode for f in exc.failures.values() if f.exitcode > 0]
        return codes[0] if codes else 1
    except agent._api.SignalException as exc:
        if agent.timed_out:
            name = signal.Signals(agent.signal).name
            print(
                f"lightning-bridge: error: the training processes were still running "
                f"{timeout:g} s after {name} and were killed",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signal.SIGKILL
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
