"""A trial on the Ray cluster: its placement (`Placement`: the `TrialSlot` actors that hold
its resources, one per node, in a placement group across nodes, or a node's warm process for
a search's trial on CPUs), its processes started there, and what happens to them until the
trial ends: a node lost or drained, the trial placed again (Ray picks the nodes) and continued
from its latest checkpoint, as a requeued Slurm job is; a failure run again while the trial's
failures are under `max_restarts`; the cluster gone (`ClusterGone`). `RayTrial` is its handle
(`_handle.TrialProcess`).

A trial across nodes gets `NODE_RANK`, `MASTER_ADDR` (rank 0's node, where the rendezvous
is) and every node's address (`get_cluster_info().container_addrs`); Lightning starts each
node's processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.launch._handle import TrialProcess, settle_end
from lightning_bridge.experiment.launch.ray import _cluster
from lightning_bridge.experiment.launch.ray._settings import RaySettings
from lightning_bridge.experiment.trials._checkpoints import continue_from_latest
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import (
    NODE_ADDRS_ENV,
    RayEnvironment,
)

POLL_S = 0.5
# How often a running trial's nodes are checked for a drain (one request to Ray's GCS).
DRAIN_POLL_S = 2.0
# Seconds a trial waits for the cluster to have room for it before it is refused.
PLACEMENT_TIMEOUT_S = float(os.environ.get("LIGHTNING_BRIDGE_RAY_PLACEMENT_TIMEOUT_S", "600"))


def warm_name(digest: str, node_id: str) -> str:
    """A node's warm process's actor name, for a workspace (its digest)."""
    return f"lb-warm-{digest}-{node_id[:16]}"


def placement_name(workspace: pathlib.Path, experiment_id: int, trial_id: int) -> str:
    """The trial's actors' name on the cluster: `lb-EXPERIMENT-TRIAL`, and the workspace's
    short digest, so that two workspaces sharing a cluster and a namespace never meet."""
    return f"lb-{experiment_id}-{trial_id}-{workspace_digest(workspace)}"


def workspace_digest(workspace: pathlib.Path) -> str:
    return hashlib.sha1(str(workspace.resolve()).encode()).hexdigest()[:6]


class ClusterGone(Exception):
    """The cluster went away while the trial ran."""


class Placement:
    """A trial on the cluster: its `TrialSlot` actors (one per node, in a placement group
    across nodes), their processes, and running it again where a node is lost or it failed
    under `max_restarts`."""

    def __init__(
        self,
        *,
        name: str,
        address: str,
        settings: RaySettings,
        gpus: bool,
        run_file: pathlib.Path,
        cwd: pathlib.Path,
        output: pathlib.Path,
        workspace: pathlib.Path,
        experiment_id: int,
        trial_id: int,
        warm: Callable[[str | None], Any],
        lost: Callable[[], str | None],
    ) -> None:
        self.name = name
        self.address = address
        self.settings = settings
        self.gpus = gpus
        self.run_file = run_file
        self.cwd = cwd
        self.output = output
        self.workspace = workspace
        self.experiment_id = experiment_id
        self.trial_id = trial_id
        self._warm = warm
        self._lost = lost
        # what runs each node's process: (TrialSlot, 0) or (WarmNode, the trial's pid)
        self._runners: list[tuple[Any, int]] = []
        self._group: Any = None
        self._stopping: int | None = None  # the signal the trial was stopped with
        self._drained: str | None = None  # the node being drained its processes were told of
        self._gone = threading.Event()
        self.nodes: list[dict[str, str]] = []
        self.restarts = 0  # runs after a lost node
        self.failures = 0  # runs after a failure (max_restarts)

    @property
    def lost_reason(self) -> str | None:
        """Why the cluster went away, once it did (the launcher's watch of it)."""
        return self._lost()

    @property
    def job_id(self) -> str:
        """The record's name for it: the actors' name and the cluster's address."""
        return f"{self.settings.namespace}/{self.name}@{self.address}"

    # ----- placing -----

    def _place(self) -> None:
        """Reserve the trial's resources and wait for Ray to place them: a search's trial
        on one node's CPUs in a placement group, forked there by the node's warm process (no
        actor to start: a fraction of a second); any other trial in `TrialSlot` actors (in a
        placement group across nodes), which Ray gives its GPUs."""
        ray = _cluster.import_ray()
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from lightning_bridge.experiment.launch.ray._actors import TrialSlot

        bundle = self.settings.node_resources(self.gpus)
        if self.settings.nodes == 1 and not self.gpus and self._warm(None) is not None:
            self._group = placement_group([bundle], strategy="PACK", name=self.name)
            self._wait_placed(ray, [self._group.ready()])
            node_id = str(placement_group_table(self._group)["bundles_to_node_id"][0])
            warm = self._warm(node_id)
            self.nodes = [ray.get(warm.where.remote())]
            self._runners = [(warm, 0)]
            return
        options = self.settings.actor_options(self.gpus)
        remote = ray.remote(TrialSlot)
        if self.settings.nodes > 1:
            bundles = [bundle] * self.settings.nodes
            self._group = placement_group(bundles, strategy="STRICT_SPREAD", name=self.name)
        for rank in range(self.settings.nodes):
            extra: dict[str, Any] = {}
            if self._group is not None:
                extra["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=rank
                )
            slot = remote.options(
                name=f"{self.name}-{rank}",
                namespace=self.settings.namespace,
                max_concurrency=4,
                max_restarts=0,
                **options,
                **extra,
            ).remote()
            self._runners.append((slot, 0))
        where = [slot.where.remote() for slot, _ in self._runners]
        self._wait_placed(ray, where)
        self.nodes = list(ray.get(where))

    def _wait_placed(self, ray: Any, refs: list[Any]) -> None:
        """Until Ray placed what `refs` wait for (or the trial was stopped, or the cluster
        went away); refused after PLACEMENT_TIMEOUT_S."""
        deadline = time.monotonic() + PLACEMENT_TIMEOUT_S
        while True:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
            if len(ready) == len(refs):
                return
            if self._gone.is_set():
                raise ClusterGone(self._lost() or "the Ray cluster went away")
            if self._stopping is not None:
                raise _Stopped()
            if time.monotonic() > deadline:
                raise InvalidArgumentError(
                    f"the Ray cluster at {self.address} did not place trial {self.trial_id} "
                    f"within {PLACEMENT_TIMEOUT_S:g} s (it needs "
                    f"{self.settings.nodes} x {self.settings.node_resources(self.gpus)}); "
                    "free or add resources, or lower resources.slots_per_trial"
                )

    def _start(self) -> None:
        """Start the trial's process on each of its nodes."""
        ray = _cluster.import_ray()
        count = len(self._runners)
        addrs = [n["ip"] for n in self.nodes]
        base = {
            NODE_ADDRS_ENV: ",".join(addrs),
        }
        self._drained = None
        self.drain_marker.unlink(missing_ok=True)
        environment = RayEnvironment(
            placement=self.name,
            restart_count=self.failures,
            max_restarts=self.settings.max_restarts,
            drain_marker=str(self.drain_marker),
        )
        environment.export_to(base)
        run_file, cwd = str(self.run_file), str(self.cwd)
        if self._group is not None and count == 1:  # forked by the node's warm process
            warm = self._runners[0][0]
            pid = int(ray.get(warm.start_trial.remote(run_file, cwd, base, str(self.output))))
            self._runners = [(warm, pid)]
            return
        if count > 1:
            port = int(ray.get(self._runners[0][0].free_port.remote()))
            base.update(
                {
                    "MASTER_ADDR": addrs[0],
                    "MASTER_PORT": str(port),
                    "LOCAL_WORLD_SIZE": str(self.settings.per_node),
                }
            )
        started = []
        for rank, (slot, _) in enumerate(self._runners):
            env = dict(base)
            output = self.output
            if count > 1:
                env["NODE_RANK"] = str(rank)
                if rank:
                    output = self.output.with_name(f"output.node{rank}.log")
            warm = self._warm(self.nodes[rank]["node_id"]) if count == 1 else None
            started.append(slot.start.remote(run_file, cwd, env, str(output), warm))
        ray.get(started)

    # ----- running -----

    def run(self, say: Callable[[str], None]) -> int:
        """Place the trial and run it to its end; its exit code. A lost node: placed again
        (Ray picks another node) and continued from its latest checkpoint; a failure while
        its failures are under `max_restarts`: the same."""
        ray = _cluster.import_ray()
        lost: str | None
        with Registry(self.workspace) as registry:
            while True:
                try:
                    self._place()
                    self._record(registry, "RUNNING")
                    say(f"Trial {self.trial_id}: {self.describe()}")
                    self._start()
                    code = self._wait(ray)
                except _Stopped:
                    self.release()
                    return 128 + (self._stopping or signal.SIGTERM)
                except ClusterGone as exc:
                    self.release(quiet=True)
                    self.record_cluster_gone(registry, str(exc))
                    return 1
                except ray.exceptions.RayActorError as exc:
                    code = None
                    lost = _first_line(exc)
                except (InvalidArgumentError, ray.exceptions.RayError) as exc:
                    # not placed in time, or a node that cannot run it (its files not there)
                    self.release()
                    message = _first_line(exc)
                    registry.job_state(self.trial_id, "FAILED", message, self.restarts)
                    registry.trial_ended(self.trial_id, TrialState.ERROR, message, if_active=True)
                    return 1
                else:
                    lost = None
                self.release()
                if self._gone.is_set():
                    return 1
                drained = self._drained
                stopped = registry.trial(self.trial_id).state == TrialState.STOPPED.value
                if drained is not None and code == 0 and stopped and self._stopping is None:
                    # it checkpointed and stopped because its node is being drained
                    self.restarts += 1
                    reason = f"its node {drained[:12]} is being drained"
                    registry.job_state(self.trial_id, "REQUEUED", reason, self.restarts)
                    say(
                        f"Trial {self.trial_id}: {reason}; it continues on another node from "
                        "its latest checkpoint"
                    )
                    self._continue_from_latest()
                    continue
                if code is None:  # a node lost: the trial runs again elsewhere
                    if self._stopping is not None:
                        return 1
                    self.restarts += 1
                    registry.job_state(
                        self.trial_id, "REQUEUED", f"its node was lost: {lost}", self.restarts
                    )
                    say(
                        f"Trial {self.trial_id}: its node was lost ({lost}); it continues on "
                        "another node from its latest checkpoint"
                    )
                    self._continue_from_latest()
                    continue
                retry = self.failures < self.settings.max_restarts
                state = registry.trial(self.trial_id).state
                if code < 0 and state in (TrialState.ACTIVE.value, TrialState.STOPPED.value):
                    # ended by a signal from outside (`experiment kill`, which records the
                    # trial killed first): stopped, not failed
                    registry.trial_ended(
                        self.trial_id,
                        TrialState.STOPPED,
                        f"killed ({signal.Signals(-code).name})",
                        if_active=True,
                    )
                    self._record(registry, "CANCELLED")
                    return code
                if code != 0 and self._stopping is None and retry:
                    if state in (TrialState.ERROR.value, TrialState.ACTIVE.value):
                        self.failures += 1
                        say(
                            f"Trial {self.trial_id} failed (exit code {code}); restart "
                            f"{self.failures} of max_restarts {self.settings.max_restarts}, "
                            "from its latest checkpoint"
                        )
                        self._continue_from_latest()
                        continue
                self._record(registry, "COMPLETED" if code == 0 else "FAILED")
                return code

    def _wait(self, ray: Any) -> int | None:
        """Until every node's process ended (the exit code of the first that failed, else 0)
        or a node was lost (RayActorError)."""
        pending = {actor.wait.remote(pid): rank for rank, (actor, pid) in enumerate(self._runners)}
        codes: dict[int, int] = {}
        next_drain_check = time.monotonic() + DRAIN_POLL_S
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if self._gone.is_set():
                raise ClusterGone(self._lost() or "the Ray cluster went away")
            if time.monotonic() >= next_drain_check and self._drained is None:
                self._stop_if_drained()
                next_drain_check = time.monotonic() + DRAIN_POLL_S
            for ref in ready:
                rank = pending.pop(ref)
                codes[rank] = int(ray.get(ref))
                if codes[rank] != 0 and pending:
                    for actor, pid in self._runners:  # one node failed: no others go on
                        with contextlib.suppress(Exception):
                            actor.send_signal.remote(signal.SIGKILL, pid)
        failed = [c for c in codes.values() if c != 0]
        return failed[0] if failed else 0

    @property
    def drain_marker(self) -> pathlib.Path:
        """A file beside the trial's run description while its node is being drained: the
        trial's processes, stopped by it, keep their search trial (`RayEnvironment`)."""
        return self.run_file.with_name("ray-node-drained")

    def _stop_if_drained(self) -> None:
        """A node of the trial is being drained (Ray places nothing more there, and ends it at
        its deadline): the trial checkpoints and stops (SIGTERM, as a pause), and `run`
        places it again on other nodes, from that checkpoint, as Determined reschedules a
        preempted trial."""
        if self._stopping is not None:
            return
        draining = _cluster.draining_nodes()
        node = next((n["node_id"] for n in self.nodes if n["node_id"] in draining), None)
        if node is None:
            return
        self._drained = node
        self.drain_marker.write_text(node)
        for actor, pid in self._runners:
            with contextlib.suppress(Exception):
                actor.send_signal.remote(signal.SIGTERM, pid)

    def _continue_from_latest(self) -> None:
        run = RunDescription.read(self.run_file)
        continue_from_latest(run, self.run_file)

    def _record(self, registry: Registry, state: str) -> None:
        registry.job_state(self.trial_id, state, self.describe_nodes(), self.restarts)

    def describe_nodes(self) -> str:
        """Where it runs: each node's address and Ray node id, and the actors' name."""
        shown = ", ".join(f"{n['ip']} (node {n['node_id'][:12]})" for n in self.nodes)
        return f"Ray actor {self.name} on node {shown}" if self.nodes else f"Ray actor {self.name}"

    def describe(self) -> str:
        return f"{self.describe_nodes()}, {len(self.nodes)} node(s)"

    # ----- stopping -----

    def stop(self, kill: bool) -> None:
        """Pause (SIGTERM: the trial checkpoints and stops) or kill the trial's processes."""
        self._stopping = signal.SIGKILL if kill else signal.SIGTERM
        for actor, pid in self._runners:
            with contextlib.suppress(Exception):
                actor.send_signal.remote(self._stopping, pid)

    def record_cluster_gone(self, registry: Registry, reason: str) -> None:
        """The cluster went away (`reason`): the job is gone, the trial stopped (continued
        from its latest checkpoint by `experiment continue`) unless it recorded its end."""
        registry.job_state(self.trial_id, "GONE", f"the Ray cluster went away: {reason}")
        registry.trial_ended(
            self.trial_id,
            TrialState.STOPPED,
            f"the Ray cluster at {self.address} went away ({reason}); it continues from its "
            "latest checkpoint with `experiment continue`",
            if_active=True,
        )

    def cluster_lost(self, reason: str) -> None:
        self._gone.set()

    def release(self, quiet: bool = False) -> None:
        """End the slots (their processes with them) and give back the resources (a node's
        warm process stays, for the next trial)."""
        runners, group = self._runners, self._group
        self._runners, self._group = [], None
        if quiet or self._gone.is_set():
            return
        ray = _cluster.import_ray()
        for actor, pid in runners:
            with contextlib.suppress(Exception):
                if pid:  # a forked trial: ended, its warm process kept
                    actor.send_signal.remote(signal.SIGKILL, pid)
                else:
                    ray.kill(actor)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(group)


class _Stopped(Exception):
    """Stopped before its processes started."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class RayTrial(TrialProcess):
    """A trial placed on the cluster (`TrialProcess`): followed by running its `Placement` to
    its end in the thread that follows it; paused and killed through its actors."""

    def __init__(self, placement: Placement, forget: Callable[[], object]) -> None:
        self.placement = placement
        self._forget = forget  # the launcher's: no longer one of its running placements

    def wait(self) -> int:
        code = self.placement.run(say=_print)
        self.placement.release()
        return code

    def send_signal(self, sig: int) -> None:
        self.placement.stop(kill=sig == signal.SIGKILL)

    def announce(self) -> str:
        placement = self.placement
        return (
            f"Trial {placement.trial_id}: placed on the Ray cluster at {placement.address} as "
            f"{placement.name}; its output: {placement.output}"
        )

    def follow(self, registry: Registry) -> int:
        try:
            code = self.placement.run(say=_print)
        finally:
            self._forget()
        if self.placement.lost_reason is not None:
            # the cluster watch's thread records the end and ends the process
            threading.Event().wait(60)
        return code

    def stopping(self, kill: bool) -> str:
        what = "Killing" if kill else "Pausing"
        return f"{what} {self.placement.name}: the trial checkpoints and stops"

    def settle(self, registry: Registry, trial_id: int, code: int, paused: bool) -> int:
        return _outcome(registry, trial_id, self.placement, code, paused)


def _outcome(
    registry: Registry,
    trial_id: int,
    placement: Placement,
    code: int,
    paused: bool,
) -> int:
    """The exit code of a trial whose placement ended: its recorded end, or (it ended without
    the trial recording one: killed, the cluster gone) STOPPED / ERROR."""
    failed = (
        f"{placement.name} ended (exit code {code}) without the trial recording an end; "
        f"its output: {placement.output}"
    )
    return settle_end(registry, trial_id, f"{placement.name} killed" if paused else None, failed)


def _print(message: str) -> None:
    print(message, flush=True)
