"""The Ray launcher's settings: what a trial asks of the cluster, from Determined's config keys
and the config's `ray` section (validated here, one line per bad key), fitted to the cluster's
nodes.

Determined's config keys keep their meaning: `resources.slots_per_trial` processes, each with
a GPU where the cluster has GPUs (CPUs otherwise: `ray.cpus_per_slot` each),
`ray.slots_per_node` of them per node (a trial with more slots spans nodes; without it, the
nodes are found as Determined's scheduler finds them, `fit_nodes`), `resources.resource_pool`
a Ray custom resource of that name (one unit per slot: a pool's nodes declare it, `ray start
--resources='{"POOL": SLOTS}'`), `resources.max_slots` the slots a search's trials take at
once, and `max_restarts` the failures run again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config_errors import launcher_section
from lightning_bridge.experiment.config._config_schema import RAY_MESSAGES, RaySection


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


def node_capacity(ray: Any, gpus: bool, pool: str | None) -> list[tuple[str, float, float]]:
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
