"""`Snapshotter`: copies of checkpoint payloads that later training cannot change.

A checkpoint written in the background must hold the state of the batch it was taken at, so
its tensors are copied off the live model before training goes on (onto the CPU for
accelerator tensors). Tensors sharing a storage still share one copy (so the file does not
grow), containers are rebuilt (keeping a state dict's type and `_metadata`), other mutable
leaves are deep-copied.

The copy is the only part of a background save that blocks training, so it is made cheap:
copies reuse the previous snapshot's memory for the same storages (one save is in flight at a
time, so that snapshot is written by then; fresh memory costs page faults), and run on one
thread (copying is memory-bound, and a parallel copy waits for its slowest thread, which on a
busy machine made it twice as slow). Peak memory is one checkpoint-sized copy either way;
`release` frees it when the fit ends.
"""

from __future__ import annotations

import copy as copying
from typing import Any

import numpy as np
import torch

_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), np.generic)
_Key = tuple[str, int, int]  # (device, data pointer, bytes) of a source storage


class Snapshotter:
    """Copies payloads (see the module docstring), reusing the last snapshot's storages."""

    def __init__(self) -> None:
        self._staging: dict[_Key, torch.UntypedStorage] = {}

    def copy(self, payload: Any) -> Any:
        """A copy of `payload` that shares no tensor memory with it."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        used: dict[_Key, torch.UntypedStorage] = {}
        try:
            return self._copy(payload, used)
        finally:
            torch.set_num_threads(threads)
            self._staging = used

    def release(self) -> None:
        """Forget the last snapshot's memory."""
        self._staging = {}

    def _copy(self, obj: Any, used: dict[_Key, torch.UntypedStorage]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj.detach(), used)
        if isinstance(obj, dict):
            out = copying.copy(obj)  # keeps the mapping's type and attributes
            for key in list(out):
                out[key] = self._copy(out[key], used)
            return out
        if isinstance(obj, list):
            return [self._copy(v, used) for v in obj]
        if isinstance(obj, tuple):
            items = [self._copy(v, used) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        if isinstance(obj, _IMMUTABLE):
            return obj
        if isinstance(obj, np.ndarray):
            return obj.copy()
        return copying.deepcopy(obj)

    def _copy_tensor(
        self, tensor: torch.Tensor, used: dict[_Key, torch.UntypedStorage]
    ) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
            key = (str(storage.device), storage.data_ptr(), storage.nbytes())
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return tensor.to("cpu", copy=True)
        copied = used.get(key)
        if copied is None:
            source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            reused = self._staging.get(key)
            if reused is not None:
                torch.empty(0, dtype=torch.uint8).set_(reused).copy_(source)
                copied = reused
            else:
                copied = source.to("cpu", copy=True).untyped_storage()
            used[key] = copied
        out = torch.empty(0, dtype=tensor.dtype)
        out.set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())
        return out


def snapshot(payload: Any) -> Any:
    """A one-off copy of `payload` (see `Snapshotter.copy`)."""
    return Snapshotter().copy(payload)
