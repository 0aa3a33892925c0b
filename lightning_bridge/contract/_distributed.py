"""`DistributedContext`: rank, sizes and object collectives of the running processes; and
`split_batch_size`, the `global_batch_size` hyperparameter split across them.

Backed by `torch.distributed` once a process group exists (Lightning's strategies create it,
or the user did before `init()`); before that, and in a single process, it answers from the
launcher's environment (torchrun / Lightning set RANK, WORLD_SIZE, LOCAL_RANK, ...).
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from lightning_bridge._errors import InvalidArgumentError


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
    ) -> None:
        self._fixed = {
            "rank": rank,
            "size": size,
            "local_rank": local_rank,
            "local_size": local_size,
            "cross_rank": cross_rank,
            "cross_size": cross_size,
        }

    @classmethod
    def from_torch_distributed(cls) -> DistributedContext:
        """The context of an initialised `torch.distributed` process group (e.g. under torchrun)."""
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "DistributedContext.from_torch_distributed() needs an initialised process group: "
                "call torch.distributed.init_process_group(...) first, or launch with torchrun."
            )
        return cls()

    def _get(self, key: str) -> int:
        fixed = self._fixed[key]
        if fixed is not None:
            return fixed
        initialised = dist.is_available() and dist.is_initialized()
        if key == "rank":
            return dist.get_rank() if initialised else _env_int("RANK", default=0)
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

    def broadcast(self, obj: Any) -> Any:
        """The chief's `obj` on every process."""
        if not self._collective():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather(self, obj: Any) -> list:
        """Every process's `obj`, in rank order, on every process."""
        if not self._collective():
            return [obj]
        out: list = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def gather(self, obj: Any) -> list | None:
        """Every process's `obj` on the chief (rank 0); None elsewhere."""
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
