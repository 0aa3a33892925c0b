"""The Ray launcher: each trial placed on a Ray cluster with the resources its config asks for
(`run --launcher ray`); Ray places and supervises its processes, Lightning runs the fit.

Determined's config keys keep their meaning: `resources.slots_per_trial` processes, each with
a GPU where the cluster has GPUs (CPUs otherwise: `ray.cpus_per_slot` each),
`ray.slots_per_node` of them per node (a trial with more slots spans nodes through a
placement group, one bundle per node, STRICT_SPREAD; without it, the nodes are found as
Determined's scheduler finds them, `fit_nodes`), `resources.resource_pool` a Ray custom
resource of that name (one unit per slot: a pool's nodes declare it, `ray start
--resources='{"POOL": SLOTS}'`), `resources.max_slots` the slots a search's trials take at
once, and `max_restarts` the failures run again. A trial whose node is lost runs again on
another node from its latest checkpoint, as a requeued Slurm job does.

On each node of a trial a `TrialSlot` actor holds the trial's resources and runs its process
there (`_actors`); a trial across nodes gets `NODE_RANK`, `MASTER_ADDR` (rank 0's node, where
the rendezvous is) and every node's address (`get_cluster_info().container_addrs`), and
Lightning starts each node's processes. The workspace (record, run descriptions, checkpoints
unless they go to S3 / GCS / Azure) is on a file system every node mounts at the same path;
the record on PostgreSQL.

The coordinator (`run`, `experiment continue`) follows its trials (the contract's
`run_trial`, `RayTrial` the handle); Ctrl-C / SIGTERM pauses
them (each checkpoints and stops; a second signal kills them). When the cluster goes away
(`_cluster.ClusterWatch`) it records the trial stopped at its latest checkpoint and says so in
one message, before Ray would end this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config_errors import launcher_section
from lightning_bridge.experiment.config._config_schema import RAY_MESSAGES, RaySection
from lightning_bridge.experiment.launch._contract import Launcher, RunningTrial
from lightning_bridge.experiment.launch._handle import TrialProcess, settle_end
from lightning_bridge.experiment.launch.ray import _cluster
from lightning_bridge.experiment.trial_process import _execute
from lightning_bridge.experiment.trials import _trial_runs
from lightning_bridge.experiment.trials._checkpoints import continue_from_latest
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._registry import LIVE_JOB_STATES, Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import (
    NODE_ADDRS_ENV,
    RayEnvironment,
)

logger = logging.getLogger("lightning_bridge")

POLL_S = 0.5
# How often a running trial's nodes are checked for a drain (one request to Ray's GCS).
DRAIN_POLL_S = 2.0
# Seconds a trial waits for the cluster to have room for it before it is refused.
PLACEMENT_TIMEOUT_S = float(os.environ.get("LIGHTNING_BRIDGE_RAY_PLACEMENT_TIMEOUT_S", "600"))


def ray_section(given: Any) -> RaySection:
    """The config's `ray` section, validated: InvalidArgumentError with the one line its
    first bad key gets (`RAY_MESSAGES`)."""
    return launcher_section(RaySection, given, "ray", RAY_MESSAGES)


@dataclasses.dataclass(frozen=True)
class RaySettings:
    """The trial's request to Ray, from Determined's config keys and the `ray` section."""

    slots: int
    slots_per_node: int  # 0: not given, found from the cluster's nodes (`fitted`)
    cpus_per_slot: float
    pool: str | None
    max_slots: int | None
    runtime_env: dict[str, Any] | None
    namespace: str
    max_restarts: int

    @classmethod
    def of(cls, plan: _plan.Plan) -> RaySettings:
        raw = plan.config.raw
        section = ray_section(raw.get("ray"))
        resources = raw.get("resources") or {}
        pool = resources.get("resource_pool")
        max_slots = resources.get("max_slots")
        return cls(
            slots=plan.processes,
            slots_per_node=section.slots_per_node or 0,
            cpus_per_slot=float(section.cpus_per_slot),
            pool=str(pool) if pool else None,
            max_slots=int(max_slots) if isinstance(max_slots, int) and max_slots > 0 else None,
            runtime_env=section.runtime_env,
            namespace=section.namespace,
            max_restarts=plan.config.model.max_restarts,
        )

    @property
    def per_node(self) -> int:
        return min(self.slots_per_node or self.slots, self.slots)

    def fitted(self, sizes: Sequence[int], address: str, unit: str) -> RaySettings:
        """The settings with `slots_per_node` found from the alive nodes' sizes in slots
        (`fit_nodes`) where the config left it out; a trial no set of nodes holds that way is
        refused, naming the nodes' sizes."""
        if self.slots_per_node:
            return self
        per_node = fit_nodes(self.slots, sizes)
        if per_node is None:
            shown = ", ".join(f"{count} x {size}" for size, count in _size_counts(sizes))
            raise InvalidArgumentError(
                f"resources.slots_per_trial: {self.slots} slots fit on no single node of the "
                f"Ray cluster at {address} and do not split into whole nodes of one size (its "
                f"alive nodes' slots, {unit}: {shown or 'no alive nodes'}); make "
                "slots_per_trial at most one node's slots or a multiple of a node size that "
                "enough nodes have, set ray.slots_per_node, or add nodes"
            )
        return dataclasses.replace(self, slots_per_node=per_node)

    def check(self) -> None:
        """Refuse a trial whose processes cannot split evenly over its nodes (Lightning runs
        the same number on each)."""
        if self.slots % self.per_node:
            raise InvalidArgumentError(
                f"resources.slots_per_trial: {self.slots} processes do not split evenly into "
                f"nodes of ray.slots_per_node {self.per_node}; make slots_per_trial a multiple "
                "of slots_per_node"
            )

    @property
    def nodes(self) -> int:
        return math.ceil(self.slots / self.per_node)

    def node_resources(self, gpus: bool) -> dict[str, float]:
        """What one node's part of the trial reserves (a placement group's bundle)."""
        out = {"CPU": self.per_node * self.cpus_per_slot}
        if gpus:
            out["GPU"] = float(self.per_node)
        if self.pool:
            out[self.pool] = float(self.per_node)
        return out

    def actor_options(self, gpus: bool) -> dict[str, Any]:
        """`ray.remote` options of a node's `TrialSlot` (its bundle's resources)."""
        wanted = self.node_resources(gpus)
        options: dict[str, Any] = {"num_cpus": wanted.pop("CPU"), "num_gpus": wanted.pop("GPU", 0)}
        if wanted:
            options["resources"] = wanted
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        return options


def fit_nodes(slots: int, sizes: Sequence[int]) -> int | None:
    """The slots per node of a trial of `slots` slots on nodes of `sizes` slots, as
    Determined's agent resource manager fits a trial (`findFits`): one node where one holds
    it; else the fewest nodes of one size, each fully used, trying the largest size first,
    `slots` a multiple of that size and enough nodes of it. None: no such nodes."""
    if any(size >= slots for size in sizes):
        return slots
    for size, count in _size_counts(sizes):
        if size > 0 and slots % size == 0 and size * count >= slots:
            return size
    return None


def _size_counts(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Each node size with how many nodes have it, the largest first."""
    return sorted(((s, list(sizes).count(s)) for s in set(sizes)), reverse=True)


def _node_capacity(ray: Any, gpus: bool, pool: str | None) -> list[tuple[str, float, float]]:
    """Each alive node's address, slots (GPUs, else CPUs) and pool units."""
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        slots = float(res.get("GPU", 0) if gpus else res.get("CPU", 0))
        units = float(res.get(pool, 0)) if pool else 0.0
        out.append((str(node.get("NodeManagerAddress")), slots, units))
    return out


class RayLauncher(Launcher):
    """Trials placed on a Ray cluster (see the module docstring)."""

    name = "ray"
    several_machines = True
    scheduler_places = True
    config_keys = ("ray", "resources.resource_pool", "resources.max_slots", "max_restarts")

    def __init__(self) -> None:
        self.address: str | None = None
        self.gpus: bool | None = None
        self.lost: str | None = None  # why the cluster went away, once it did
        self._watch: _cluster.ClusterWatch | None = None
        self._warm: dict[str, Any] = {}  # node id -> its WarmNode (a search's)
        self._warm_lock = threading.Lock()
        self._preload: Sequence[str] = ()
        self._placements: dict[int, Placement] = {}
        self._settings: RaySettings | None = None  # the last trial's (its warm processes')
        self._digest: str | None = None  # the workspace's (`placement_name`)

    # ----- refusals, before anything is recorded -----

    def connect(self, plan: _plan.Plan) -> RaySettings:
        """Validate the `ray` section, reach the cluster (refused in one line when it does
        not answer), decide GPUs and, without `ray.slots_per_node`, find the trial's nodes
        (`fit_nodes`); the trial's settings."""
        settings = RaySettings.of(plan)
        settings.check()
        if self.address is None:
            given = _cluster.cluster_address(plan.options.address)
            self.address = _cluster.connect(given, settings.namespace)
            self._watch_cluster()
        ray = _cluster.import_ray()
        accelerator = (plan.options.accelerator or "auto").lower()
        cluster = ray.cluster_resources()
        self.gpus = accelerator in ("gpu", "cuda") or (
            accelerator == "auto" and cluster.get("GPU", 0) > 0
        )
        nodes = _node_capacity(ray, self.gpus, settings.pool)
        if settings.pool is not None and not any(units for _, _, units in nodes):
            return settings  # refused by `check`, naming the pool
        per_slot = 1.0 if self.gpus else settings.cpus_per_slot
        sizes = [
            min(int(slots // per_slot), int(units) if settings.pool else int(slots // per_slot))
            for _, slots, units in nodes
        ]
        return settings.fitted(sizes, self.address, "GPUs" if self.gpus else "CPUs")

    def check_early(self, plan: _plan.Plan) -> None:
        """The `ray` section, the cluster's answer and whether the cluster can place the
        trial: all before Lightning is loaded (none of it depends on the engine check)."""
        settings = self.connect(plan)
        ray = _cluster.import_ray()
        unit = "GPUs" if self.gpus else "CPUs"
        nodes = _node_capacity(ray, bool(self.gpus), settings.pool)
        if settings.pool is not None and not any(units for _, _, units in nodes):
            raise InvalidArgumentError(
                f"resources.resource_pool: no node of the Ray cluster at {self.address} has "
                f"the custom resource {settings.pool!r}; start the pool's nodes with `ray start "
                f"--resources='{{\"{settings.pool}\": SLOTS}}'` (KubeRay: rayStartParams "
                "resources), or leave resource_pool out"
            )
        need = settings.per_node * (1 if self.gpus else settings.cpus_per_slot)
        pooled = settings.pool is None
        fitting = [n for n in nodes if n[1] >= need and (pooled or n[2] >= settings.per_node)]
        if len(fitting) < settings.nodes:
            shown = ", ".join(f"{a} {s:g}" for a, s, _ in nodes) or "no alive nodes"
            raise InvalidArgumentError(
                f"resources.slots_per_trial: the trial needs {settings.nodes} node(s) with "
                f"{need:g} {unit} each (ray.slots_per_node {settings.per_node}), and the Ray "
                f"cluster at {self.address} has {len(fitting)} ({unit}: {shown}); lower "
                "ray.slots_per_node (a trial with more slots spans nodes), or add nodes"
            )
        if settings.max_slots is not None and settings.slots > settings.max_slots:
            raise InvalidArgumentError(
                f"resources.max_slots: {settings.max_slots} slots, fewer than one trial's "
                f"{settings.slots} (resources.slots_per_trial); raise max_slots or leave it out"
            )

    def capacity(self, plan: _plan.Plan, processes: int) -> tuple[int, list[str]]:
        """As many trials at once as `resources.max_slots` allows (Ray queues the rest until
        the cluster has room)."""
        settings = RaySettings.of(plan)
        if settings.max_slots is None:
            return 1 << 16, []
        return max(settings.max_slots // max(processes, 1), 1), []

    def running(self, trial: Trial, job: Job | None) -> RunningTrial | None:
        if job is None or job.state not in LIVE_JOB_STATES:
            return None
        return RunningPlacement(job.job_id, job.reason)

    # ----- a trial on the cluster -----

    def _prepare(self, plan: _plan.Plan, trial: _plan.TrialRun) -> RaySettings:
        """Connect, write the trial's run description (a trial across nodes: each node runs
        `per_node` processes) and its working copy."""
        settings = self.connect(plan)
        self._settings = settings
        self._digest = workspace_digest(trial.workspace)
        trial.trial_dir.mkdir(parents=True, exist_ok=True)
        if settings.nodes > 1:
            options = dataclasses.replace(
                plan.options, devices=settings.per_node, num_nodes=settings.nodes
            )
            plan = dataclasses.replace(plan, options=options)
        _execute.describe_run(plan, trial).write(trial.run_file)
        _trial_runs.prepare_work_dir(plan, trial)
        return settings

    def _placement(
        self, registry: Registry, plan: _plan.Plan, trial: _plan.TrialRun, settings: RaySettings
    ) -> Placement:
        assert self.address is not None
        name = placement_name(registry.workspace.root, trial.experiment_id, trial.trial_id)
        placement = Placement(
            name=name,
            address=self.address,
            settings=settings,
            gpus=bool(self.gpus),
            run_file=trial.run_file,
            cwd=trial.working_dir(plan),
            output=trial.trial_dir / "output.log",
            workspace=registry.workspace.root,
            experiment_id=trial.experiment_id,
            trial_id=trial.trial_id,
            warm=self._warm_for,
            lost=lambda: self.lost,
        )
        registry.job_submitted(trial.trial_id, self.name, placement.job_id, str(placement.output))
        registry.job_state(trial.trial_id, "PENDING", "waiting for the cluster's resources")
        self._placements[trial.trial_id] = placement
        return placement

    def start(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        devices: Sequence[str] = (),
    ) -> RayTrial:
        """Place the trial and return at once; its handle runs it to its end (on another node
        where its node is lost) in the thread that follows it (a search's worker's, or the
        command's, `run_trial`)."""
        settings = self._prepare(plan, trial)
        placement = self._placement(registry, plan, trial, settings)
        return RayTrial(placement, lambda: self._placements.pop(trial.trial_id, None))

    # ----- a search's warm workers -----

    def warm_up(self, preload: Sequence[str]) -> None:
        """Remember what the warm processes import; each node gets its `WarmNode` when a
        trial is first placed there (every alive node at once, in the background)."""
        self._preload = tuple(preload)

    def _warm_for(self, node_id: str | None) -> Any:
        """The node's WarmNode (`node_id` None: whether trials are forked at all); None where
        trials start cold (`LIGHTNING_BRIDGE_COLD_TRIALS=1`, or no search). The first call
        creates one on every alive node (pinned to it, reserving nothing, named for `experiment
        pause` to find), so that each warms up while the first trials start."""
        if not self._preload or os.environ.get("LIGHTNING_BRIDGE_COLD_TRIALS") == "1":
            return None
        with self._warm_lock:  # trials are placed from several threads at once
            if node_id is None or node_id not in self._warm:
                ray = _cluster.import_ray()
                alive = [str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")]
                for node in [*([node_id] if node_id else []), *alive]:
                    if node not in self._warm:
                        self._warm[node] = self._warm_node(ray, node)
        return self._warm if node_id is None else self._warm[node_id]

    def _warm_node(self, ray: Any, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from lightning_bridge.experiment.launch.ray._actors import WarmNode

        assert self._settings is not None and self._digest is not None
        options: dict[str, Any] = {}
        if self._settings.runtime_env:  # the trials' environment, which the fork keeps
            options["runtime_env"] = self._settings.runtime_env
        remote = ray.remote(WarmNode).options(
            name=f"{warm_name(self._digest, node_id)}-{os.getpid()}",
            namespace=self._settings.namespace,
            num_cpus=0,
            max_concurrency=64,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **options,
        )
        return remote.remote(tuple(self._preload), {})

    def close(self) -> None:
        self._unwatch()
        if self.lost is None:
            ray = _cluster.import_ray()
            for actor in self._warm.values():
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        self._warm.clear()

    # ----- the cluster going away -----

    def _watch_cluster(self) -> None:
        if self._watch is not None or self.address is None:
            return

        def on_lost(reason: str) -> None:
            self.lost = reason
            placements = list(self._placements.values())
            for placement in placements:
                placement.cluster_lost(reason)
            _end_without_cluster(str(self.address), reason, placements)

        self._watch = _cluster.ClusterWatch(self.address, on_lost).start()

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None


def _end_without_cluster(address: str, reason: str, placements: Sequence[Placement]) -> None:
    """The cluster went away: record each running trial stopped (its processes, ended with
    their actors, checkpointed on the way if they could) and its job gone, say so in one
    line with the command that continues, and end this process. Ray would end it anyway
    once its GCS stayed away (a fatal error, a minute on), and a call into Ray now may never
    return, so this runs in the watch's thread and ends the process with `os._exit`."""
    stopped: list[str] = []
    experiments: set[int] = set()
    for placement in placements:
        with contextlib.suppress(Exception), Registry(placement.workspace) as registry:
            placement.record_cluster_gone(registry, reason)
            latest = registry.latest_checkpoint(placement.trial_id)
            at = f"its latest checkpoint (batch {latest.batches})" if latest else "its start"
            stopped.append(f"trial {placement.trial_id} continues from {at}")
            experiments.add(placement.experiment_id)
    commands = " / ".join(
        f"`lightning-bridge experiment continue {e}`" for e in sorted(experiments)
    )
    line = f"lightning-bridge: error: the Ray cluster at {address} went away ({reason})"
    if stopped:
        line += f"; {', '.join(stopped)} with {commands} once the cluster is back"
    with contextlib.suppress(Exception):
        print(line, file=sys.stderr, flush=True)
        sys.stdout.flush()
    os._exit(1)


def _print(message: str) -> None:
    print(message, flush=True)


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


class RunningPlacement(RunningTrial):
    """A recorded trial's live placement, as `experiment pause | kill | describe` reach it:
    its actors by name on the cluster the record names."""

    def __init__(self, job_id: str, reason: str) -> None:
        self.job_id = job_id
        ref, _, self.address = job_id.rpartition("@")
        self.namespace, _, self.name = ref.partition("/")
        self.key = f"Ray actor {self.name}"
        self._reason = reason

    def _runners(self, pid: int | None) -> list[tuple[Any, int]]:
        """What runs the trial's processes: its slots by name, or (a forked search trial,
        `pid` its process) the warm processes of its workspace's placements."""
        ray = _cluster.import_ray()
        _cluster.connect(self.address, self.namespace)
        runners: list[tuple[Any, int]] = []
        while True:
            try:
                name = f"{self.name}-{len(runners)}"
                runners.append((ray.get_actor(name, namespace=self.namespace), 0))
            except ValueError:
                break
        if runners or not pid:
            return runners
        from ray.util import list_named_actors

        prefix = warm_name(self.name.rpartition("-")[2], "")
        for entry in list_named_actors(all_namespaces=True):
            if entry["namespace"] == self.namespace and entry["name"].startswith(prefix):
                runners.append((ray.get_actor(entry["name"], namespace=self.namespace), pid))
        return runners

    def stop(self, registry: Registry, trial_id: int, kill: bool, signal_it: bool) -> str:
        self._pid = registry.trial(trial_id).pid
        if signal_it:
            ray = _cluster.import_ray()
            sig = signal.SIGKILL if kill else signal.SIGTERM
            runners = self._runners(self._pid)
            refs = [actor.send_signal.remote(sig, pid) for actor, pid in runners]
            with contextlib.suppress(Exception):
                ray.get(refs, timeout=30)
        return self.key

    def wait_stopped(self) -> None:
        """After a kill: until the trial's processes have ended, at most a minute."""
        ray = _cluster.import_ray()
        with contextlib.suppress(Exception):
            runners = self._runners(getattr(self, "_pid", None))
            ray.get([actor.wait.remote(pid) for actor, pid in runners], timeout=60)

    def describe(self) -> str:
        return f"{self._reason or self.key}, running"


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
