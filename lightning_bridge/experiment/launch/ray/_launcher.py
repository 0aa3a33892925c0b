"""The Ray launcher: each trial placed on a Ray cluster with the resources its config asks for
(`run --launcher ray`); Ray places and supervises its processes, Lightning runs the fit.

What a trial asks of the cluster is its settings (`_settings`: Determined's config keys and
the `ray` section, fitted to the cluster's nodes); the launcher checks them against the
cluster before anything is recorded, then places each trial (`_placement.Placement`: on each
of its nodes a `TrialSlot` actor, `_actors`, holds its resources and runs its process there;
a lost or drained node, a failure under `max_restarts`: placed again, continued from its
latest checkpoint). A search's trials are forked by a warm process on their node (`WarmNode`,
one per node, created here). The workspace (record, run descriptions, checkpoints unless they
go to S3 / GCS / Azure) is on a file system every node mounts at the same path; the record on
PostgreSQL.

The coordinator (`run`, `experiment continue`) follows its trials (the contract's
`run_trial`); Ctrl-C / SIGTERM pauses them (each checkpoints and stops; a second signal kills
them). When the cluster goes away (`_cluster.ClusterWatch`) it records the trial stopped at
its latest checkpoint and says so in one message, before Ray would end this process.
`RunningPlacement` is a recorded trial's placement as `experiment pause | kill | describe`
reach it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.launch._contract import Launcher, RunningTrial
from lightning_bridge.experiment.launch.ray import _cluster
from lightning_bridge.experiment.launch.ray._placement import (
    Placement,
    RayTrial,
    placement_name,
    warm_name,
    workspace_digest,
)
from lightning_bridge.experiment.launch.ray._settings import RaySettings, node_capacity
from lightning_bridge.experiment.trial_process import _execute
from lightning_bridge.experiment.trials import _workdir
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._registry import LIVE_JOB_STATES, Registry


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
        nodes = node_capacity(ray, self.gpus, settings.pool)
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
        nodes = node_capacity(ray, bool(self.gpus), settings.pool)
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
        _workdir.prepare_work_dir(plan, trial)
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
