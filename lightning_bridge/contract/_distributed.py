"""`DistributedContext`: rank, sizes and object collectives of the running processes; and
`split_batch_size`, the `global_batch_size` hyperparameter split across them.

Backed by `torch.distributed` once a process group exists (Lightning's strategies create it,
or the user did before `init()`); before that, and in a single process, it answers from the
launcher's environment (torchrun / Lightning set RANK, WORLD_SIZE, LOCAL_RANK, ...).

A Core API script may share objects before (or without) any process group, as Determined's
`DistributedContext` allowed: its collectives then go through a `torch.distributed` key-value
store, torchrun's own (under torchrun) or one the chief serves at `chief_ip` (a script that
starts its own workers, Determined's default port).
"""

from __future__ import annotations

import datetime
import os
import pickle
from typing import Any

import torch.distributed as dist

from lightning_bridge._errors import InvalidArgumentError

# Determined's default port for the chief's inter-process communication, how long a process
# waits for the others at a collective, and how long the chief waits for the others to close.
CHIEF_PORT = 12360
_STORE_TIMEOUT_S = 1800
_CLOSE_TIMEOUT_S = 300
# Set in a trial's processes by `lightning-bridge run` (the run description's path; named here,
# not imported from translation/, a layer above).
_TRIAL_RUN_VAR = "LIGHTNING_BRIDGE_EXPERIMENT"


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


class DistributedContext:
    """The processes of one trial: who this is, how many there are, and how to share objects."""

    def __init__(
        self,
        rank: int | None = None,
        size: int | None = None,
        local_rank: int | None = None,
        local_size: int | None = None,
        cross_rank: int | None = None,
        cross_size: int | None = None,
        chief_ip: str | None = None,
        pub_port: int = CHIEF_PORT,
        pull_port: int = CHIEF_PORT + 16,
        port_offset: int = 0,
        force_tcp: bool = False,
    ) -> None:
        self._chief_ip = chief_ip
        self._port = pub_port + port_offset
        self._store: _StoreCollectives | None = None
        self._fixed = {
            "rank": rank,
            "size": size,
            "local_rank": local_rank,
            "local_size": local_size,
            "cross_rank": cross_rank,
            "cross_size": cross_size,
        }

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """The context of processes torchrun started (RANK, WORLD_SIZE, LOCAL_RANK,
        LOCAL_WORLD_SIZE, GROUP_RANK), or of an initialised `torch.distributed` process group.
        A trial's only process (one slot: `lightning-bridge run` starts no torchrun for it) is
        rank 0 of 1, as torchrun's one worker is behind Determined's launcher."""
        if (
            not (dist.is_available() and dist.is_initialized())
            and "RANK" not in os.environ
            and not os.environ.get(_TRIAL_RUN_VAR)
        ):
            raise RuntimeError(
                "DistributedContext.from_torch_distributed() needs torchrun's environment (RANK, "
                "WORLD_SIZE, ...) or an initialised process group: launch with torchrun "
                "(python3 -m determined.launch.torch_distributed in the entrypoint)."
            )
        return cls(chief_ip=chief_ip or os.environ.get("DET_CHIEF_IP"))

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        """The context of processes DeepSpeed's launcher started (RANK, WORLD_SIZE,
        LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE)."""
        try:
            return cls(
                rank=int(os.environ["RANK"]),
                size=int(os.environ["WORLD_SIZE"]),
                local_rank=int(os.environ["LOCAL_RANK"]),
                local_size=int(os.environ.get("LOCAL_SIZE") or os.environ["LOCAL_WORLD_SIZE"]),
                cross_rank=int(os.environ.get("CROSS_RANK") or os.environ.get("GROUP_RANK") or 0),
                cross_size=int(os.environ.get("CROSS_SIZE") or os.environ.get("NUM_NODES") or 1),
                chief_ip=chief_ip or os.environ.get("DET_CHIEF_IP"),
            )
        except KeyError as exc:
            raise RuntimeError(
                f"DistributedContext.from_deepspeed() needs DeepSpeed's launcher's environment "
                f"({exc.args[0]} is not set): launch with deepspeed or torchrun."
            ) from None

    def close(self) -> None:
        """End this use of the collectives (Determined's context closes it on leaving). Where
        the chief serves their key-value store, it waits until every process has closed (so
        has read its last collective's value): else a process still reading would find the
        store gone with the chief's exit."""
        self._close(wait=True)

    def _close(self, wait: bool) -> None:
        """`close`; `wait=False` where this process is failing: the others' next collective
        then fails at once instead of the chief waiting for them. The collectives are kept:
        a context used again goes on numbering its rounds past the keys already written."""
        if self._store is not None and wait:
            self._store.close()

    def _get(self, key: str) -> int:
        fixed = self._fixed[key]
        if fixed is not None:
            return fixed
        initialised = dist.is_available() and dist.is_initialized()
        if key == "rank":
            if initialised:
                return dist.get_rank()
            if "RANK" not in os.environ and "LOCAL_RANK" in os.environ:
                # Lightning's launcher names a process's node and local rank, not its rank.
                node = _env_int("NODE_RANK", "GROUP_RANK", default=0)
                per_node = _env_int("LOCAL_WORLD_SIZE", default=1) if node else 0
                return node * per_node + _env_int("LOCAL_RANK", default=0)
            return _env_int("RANK", default=0)
        if key == "size":
            return dist.get_world_size() if initialised else _env_int("WORLD_SIZE", default=1)
        if key == "local_rank":
            return _env_int("LOCAL_RANK", default=self._get("rank"))
        if key == "local_size":
            return _env_int("LOCAL_WORLD_SIZE", default=self._get("size"))
        if key == "cross_rank":
            return _env_int("GROUP_RANK", "NODE_RANK", default=0)
        size, local = self._get("size"), self._get("local_size")
        return _env_int("NUM_NODES", default=max(1, size // max(1, local)))

    @property
    def rank(self) -> int:
        return self._get("rank")

    @property
    def size(self) -> int:
        return self._get("size")

    @property
    def local_rank(self) -> int:
        return self._get("local_rank")

    @property
    def local_size(self) -> int:
        return self._get("local_size")

    @property
    def cross_rank(self) -> int:
        return self._get("cross_rank")

    @property
    def cross_size(self) -> int:
        return self._get("cross_size")

    # Determined's private flags, read by some trials: this process is the chief (rank 0), the
    # first of its machine (local rank 0).
    @property
    def _is_chief(self) -> bool:
        return self.rank == 0

    @property
    def _is_local_chief(self) -> bool:
        return self.local_rank == 0

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_size(self) -> int:
        return self.local_size

    def get_cross_rank(self) -> int:
        return self.cross_rank

    def get_cross_size(self) -> int:
        return self.cross_size

    def _collective(self) -> bool:
        return self.size > 1 and dist.is_available() and dist.is_initialized()

    def _without_group(self) -> _StoreCollectives | None:
        """The store-backed collectives of several processes with no process group (see the
        module docstring); None for one process, or where a group exists (or may yet: the
        context answers from the environment and no store is named)."""
        if self.size <= 1 or self._collective():
            return None
        if self._store is None:
            store = _agent_store() if self._chief_ip is None else None
            if store is None and self._chief_ip is None and self._fixed["size"] is None:
                return None
            if store is None:
                if self._chief_ip is None:
                    raise RuntimeError(
                        f"DistributedContext of {self.size} processes without a process group: "
                        "give chief_ip (the chief's address) or launch with torchrun."
                    )
                store = dist.TCPStore(
                    self._chief_ip,
                    self._port,
                    world_size=self.size,
                    is_master=self.rank == 0,
                    timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
                )
            self._store = _StoreCollectives(self.rank, self.size, store)
        return self._store

    def broadcast(self, obj: Any) -> Any:
        """The chief's `obj` on every process."""
        if (store := self._without_group()) is not None:
            return store.broadcast(obj)
        if not self._collective():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather(self, obj: Any) -> list:
        """Every process's `obj`, in rank order, on every process."""
        if (store := self._without_group()) is not None:
            return store.allgather(obj)
        if not self._collective():
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list | None:
        """Every process's `obj` on the chief (rank 0); None elsewhere."""
        if (store := self._without_group()) is not None:
            everyone = store.allgather(obj)
            return everyone if self.rank == 0 else None
        if not self._collective():
            return [obj]
        out: list | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast_local(self, obj: Any) -> Any:
        """Single-node form of `broadcast`."""
        return self.broadcast(obj)

    def allgather_local(self, obj: Any) -> list:
        """Single-node form of `allgather`."""
        return self.allgather(obj)

    def gather_local(self, obj: Any) -> list | None:
        """Single-node form of `gather`."""
        return self.gather(obj)


def _agent_store() -> Any:
    """torchrun's key-value store (its agent's, named in the workers' environment), under a
    prefix of its own; None outside torchrun."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port and os.environ.get("TORCHELASTIC_RUN_ID")):
        return None
    store = dist.TCPStore(
        addr,
        int(port),
        is_master=False,
        timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
    )
    return dist.PrefixStore(f"lightning_bridge.core/{os.environ['TORCHELASTIC_RUN_ID']}", store)


class _StoreCollectives:
    """Object collectives over a key-value store: each call a numbered round, every process
    writing its object under the round and reading the others' (a read waits for the write)."""

    def __init__(self, rank: int, size: int, store: Any) -> None:
        self._rank, self._size, self._store = rank, size, store
        self._round = 0
        self._closes = 0

    def allgather(self, obj: Any) -> list:
        self._round += 1
        self._store.set(f"{self._round}/{self._rank}", pickle.dumps(obj))
        return [pickle.loads(self._store.get(f"{self._round}/{r}")) for r in range(self._size)]

    def broadcast(self, obj: Any) -> Any:
        self._round += 1
        if self._rank == 0:
            self._store.set(f"{self._round}/0", pickle.dumps(obj))
            return obj
        return pickle.loads(self._store.get(f"{self._round}/0"))

    def close(self) -> None:
        """Every process marks itself closed; the chief waits for all of them (bounded: a
        process that died never marks itself, and the chief then closes anyway)."""
        self._closes += 1
        self._store.set(f"closed.{self._closes}/{self._rank}", b"1")
        if self._rank != 0:
            return
        try:
            self._store.wait(
                [f"closed.{self._closes}/{r}" for r in range(self._size)],
                datetime.timedelta(seconds=_CLOSE_TIMEOUT_S),
            )
        except (RuntimeError, dist.DistError):  # the wait's bound: a process is gone
            pass


def split_batch_size(hparams: dict[str, Any] | None, slots: int) -> tuple[int | None, int | None]:
    """(per-slot, global) batch size from `global_batch_size`, or (None, None) without it.

    As in Determined, the global size must divide evenly across the `slots` processes.
    """
    if not hparams or hparams.get("global_batch_size") is None:
        return None, None
    global_bs = hparams["global_batch_size"]
    if isinstance(global_bs, bool) or not isinstance(global_bs, int) or global_bs < 1:
        raise InvalidArgumentError(
            f"The global_batch_size hyperparameter must be a positive int; got {global_bs!r}."
        )
    if global_bs % slots != 0:
        raise InvalidArgumentError(
            f"global_batch_size={global_bs} does not divide evenly across {slots} processes; "
            f"set it to a multiple of {slots}, e.g. {max(slots, global_bs - global_bs % slots)}"
        )
    return global_bs // slots, global_bs
