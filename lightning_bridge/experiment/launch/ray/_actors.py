"""What runs on the cluster's nodes: Ray actors that hold a trial's resources and run its
processes (Ray places and supervises them; the fit itself stays Lightning's).

- `TrialSlot`: one per node of a trial, created with the trial's resources on that node
  (CPUs, GPUs, the resource pool's custom resource; in the placement group's bundle of that
  node for a trial across nodes). It runs the trial's process there (`start`), started as a
  new interpreter, or asks the node's `WarmNode` to fork it (a search's trials). Ray gives it
  the GPUs it reserved (`CUDA_VISIBLE_DEVICES`), which the process inherits. Its process
  follows it: the actor's end (killed, its node lost, its coordinator gone) ends the process.
- `WarmNode`: one per node for a search (`_warm.WarmStarter` in an actor that reserves
  nothing): its warm process has imported what a trial imports, so a trial placed on its node
  starts with a fork rather than a new interpreter. A search's trial on CPUs has no slot: a
  placement group reserves its resources and the node's WarmNode forks it (`start_trial`),
  with no actor to start.

The actors run in the node's Python environment (lightning-bridge and its `[ray]` extra
installed there, or by the config's `ray.runtime_env`), so the trial's command is the node's
interpreter, not the coordinator's.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

# The trial's process follows the actor that started it (`_parent.PARENT_ENV`, not imported
# here: the actors import as little as a Ray worker needs).
_PARENT_ENV = "LIGHTNING_BRIDGE_SEARCH_WORKER"
TRIAL_COMMAND = ("-m", "lightning_bridge", "_trial")
# The node's Ray token (its raylet's environment) is Ray's: the trial's processes never talk
# to Ray, so they do not get it.
_RAY_ONLY = ("RAY_AUTH_TOKEN",)


def _node() -> dict[str, str]:
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "host": socket.gethostname(),
        "gpus": ",".join(str(g) for g in ray.get_gpu_ids()),
        "pid": str(os.getpid()),
    }


class NotOnThisNode(Exception):
    """The trial's files are not on this node's file systems (no shared folder)."""


class TrialSlot:
    """A trial's resources on one node, and its process there (see the module docstring)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._warm: Any = None  # the WarmNode's pid of a forked trial
        self._pid = 0

    def where(self) -> dict[str, str]:
        """The node it runs on: Ray's node id, its address, host name, the GPUs Ray gave."""
        return _node()

    def free_port(self) -> int:
        """A port free on this node (the rendezvous of a trial across nodes, on rank 0's)."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        out = dict(os.environ)
        for name in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_JOB_ID", "RANK", "WORLD_SIZE"):
            out.pop(name, None)  # a cluster started inside a Slurm job: ranks are the trial's
        for name in _RAY_ONLY:
            out.pop(name, None)
        out.update(env)
        out[_PARENT_ENV] = str(os.getpid())
        return out

    def start(
        self,
        run_file: str,
        cwd: str,
        env: Mapping[str, str],
        output: str,
        warm: Any = None,
    ) -> int:
        """Start the trial's process on this node (`warm`: the node's WarmNode, which forks
        it); its pid. The trial's files must be on this node (a shared folder)."""
        if not pathlib.Path(run_file).is_file():
            raise NotOnThisNode(
                f"the trial's run description {run_file} is not on node "
                f"{socket.gethostname()}'s file systems"
            )
        command = [sys.executable, *TRIAL_COMMAND, run_file]
        environment = self._environment(env)
        if warm is not None:  # forked in the warm process's environment, with the GPUs Ray gave
            import ray

            own = dict(env)
            if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
                own["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
            self._warm = warm
            self._pid = int(ray.get(warm.start.remote(command, cwd, own, output)))
            return self._pid
        with open(output, "ab") as out:
            self._process = subprocess.Popen(
                command,
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pid = self._process.pid
        return self._pid

    def wait(self, pid: int = 0) -> int:
        """Until the process ends; its exit code (a signal's: negative). (`pid`: the
        `WarmNode.wait` signature, unused here.)"""
        if self._warm is not None:
            import ray

            return int(ray.get(self._warm.wait.remote(self._pid)))
        assert self._process is not None
        return self._process.wait()

    def send_signal(self, sig: int, pid: int = 0) -> None:
        """Signal the trial's process group (its ranks and loader workers with it)."""
        if self._warm is not None:
            import ray

            ray.get(self._warm.send_signal.remote(sig, self._pid))
            return
        if self._process is None or self._process.poll() is not None:
            return
        try:
            os.killpg(self._process.pid, sig)
        except ProcessLookupError:
            pass


class WarmNode:
    """A node's warm process for a search's trials (see the module docstring)."""

    def __init__(self, preload: Sequence[str], environment: Mapping[str, str]) -> None:
        from lightning_bridge.experiment.launch._warm import WarmStarter

        os.environ.update(environment)  # what every trial of the experiment shares
        self._starter = WarmStarter(preload)
        self._starter.warm_up()
        self._trials: dict[int, Any] = {}
        self._lock = threading.Lock()

    def where(self) -> dict[str, str]:
        return _node()

    def ready(self) -> bool:
        return bool(self._starter.ready())

    def start(self, command: Sequence[str], cwd: str, env: Mapping[str, str], output: str) -> int:
        """Fork a trial (`env`: what it adds to this actor's environment); its pid."""
        environment = {**os.environ, **env, _PARENT_ENV: str(os.getpid())}
        for name in _RAY_ONLY:
            environment.pop(name, None)
        trial = self._starter.start(list(command), cwd=cwd, env=environment, output=output)
        with self._lock:
            self._trials[trial.pid] = trial
        return int(trial.pid)

    def start_trial(self, run_file: str, cwd: str, env: Mapping[str, str], output: str) -> int:
        """Fork a trial whose resources a placement group reserves on this node (a search's
        trial on CPUs: no actor of its own to start); its pid."""
        if not pathlib.Path(run_file).is_file():
            raise NotOnThisNode(
                f"the trial's run description {run_file} is not on node "
                f"{socket.gethostname()}'s file systems"
            )
        return self.start([sys.executable, *TRIAL_COMMAND, run_file], cwd, env, output)

    def wait(self, pid: int) -> int:
        with self._lock:
            trial = self._trials[pid]
        return int(trial.wait())  # kept: a kill's wait may follow the coordinator's

    def send_signal(self, sig: int, pid: int = 0) -> None:
        with self._lock:
            trial = self._trials.get(pid)
        if trial is not None:
            trial.send_signal(sig)

    def close(self) -> None:
        self._starter.close()
