"""`CheckpointWriter`: checkpoints written in a background thread, one at a time.

Saving has a fast part that must happen while training is paused (collecting the state dicts
and, when training goes on, copying their tensors off the live model) and a slow part that
need not (serializing, writing, fsync, the atomic rename, moving `latest`). The writer takes
the slow part off the training path, as Lightning's `AsyncCheckpointIO` and torch's
asynchronous distributed checkpointing do, and keeps the layout's promise: `write_checkpoint`
still makes the directory durable before it is renamed into place and `latest` names it, so a
kill at any moment leaves at most a `.partial` directory.

A save is `submit`ted, then `start`ed: with `copy=True` when training continues (the thread
writes a snapshot, `Snapshotter`, below), with `copy=False` when nothing will change the tensors
before the write is done (the end of a fit, a preemption). At most one save is in flight:
`submit` waits for the previous one. `wait()` blocks until the write is durable and runs the
save's `on_durable` callback on the calling thread; an error in the thread is raised there
(or by `poll()`, which finishes a save that is already done without blocking). The thread is
not a daemon, so even an interpreter that exits early lets a started write finish (and the
command's own exit, `_process.exit_now`, waits for it without its bound).

`Snapshotter`: the copy a save writes while training goes on. A checkpoint written in the
background must hold the state of the batch it was taken at, so its tensors are copied off the
live model before training goes on (onto the CPU for accelerator tensors). Tensors sharing a
storage still share one copy (so the file does not grow), containers are rebuilt (keeping a
state dict's type and `_metadata`), other mutable leaves are deep-copied.

The copy is the only part of a background save that blocks training, so it is made cheap:
copies reuse the previous snapshot's memory for the same storages (one save is in flight at a
time, so that snapshot is written by then; fresh memory costs page faults), and run on one
thread (copying is memory-bound, and a parallel copy waits for its slowest thread, which on a
busy machine made it twice as slow). Peak memory is one checkpoint-sized copy either way;
`release` frees it when the fit ends.
"""

from __future__ import annotations

import copy as copying
import logging
import pathlib
import threading
import uuid as uuid_lib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lightning_bridge._errors import BridgeError
from lightning_bridge._process import wait_at_exit
from lightning_bridge.checkpoint._layout import write_checkpoint

logger = logging.getLogger("lightning_bridge")


class _Save:
    """One submitted save: what to write, and how it ended."""

    def __init__(
        self,
        base_dir: pathlib.Path,
        payload: dict[str, Any],
        trial_state: dict[str, int],
        load_data: dict[str, Any],
        storage_id: str,
        on_durable: Callable[[pathlib.Path], None] | None,
        options: dict[str, Any],
    ) -> None:
        self.base_dir = base_dir
        self.payload: dict[str, Any] | None = payload
        self.trial_state = trial_state
        self.load_data = load_data
        self.storage_id = storage_id
        self.path = base_dir / storage_id
        self.on_durable = on_durable
        self.options = options  # further arguments of `write_checkpoint`
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            payload, self.payload = self.payload, None
            assert payload is not None
            write_checkpoint(
                self.base_dir,
                payload,
                self.trial_state,
                self.load_data,
                storage_id=self.storage_id,
                **self.options,
            )
        except BaseException as exc:  # re-raised on the training thread
            self.error = exc
        finally:
            self.done.set()


class CheckpointWriter:
    """Writes submitted checkpoints in a background thread, one at a time (see module doc)."""

    def __init__(self) -> None:
        self._save: _Save | None = None
        self._snapshots = Snapshotter()

    @property
    def busy(self) -> bool:
        """Whether a save is submitted and not yet finished by `wait` / `poll`."""
        return self._save is not None

    @property
    def queued(self) -> bool:
        """Whether a submitted save waits for `start`."""
        return self._save is not None and self._save.thread is None

    def submit(
        self,
        base_dir: pathlib.Path,
        payload: dict[str, Any],
        trial_state: dict[str, int],
        load_data: dict[str, Any],
        on_durable: Callable[[pathlib.Path], None] | None = None,
        **options: Any,
    ) -> tuple[pathlib.Path, str]:
        """Queue a checkpoint (after the previous one is durable); returns its future path and
        id. `start` begins the write; `on_durable(path)` runs once it is complete; `options` go
        to `write_checkpoint` (the code folder to copy)."""
        self.wait()
        storage_id = str(uuid_lib.uuid4())
        self._save = _Save(
            base_dir, payload, trial_state, load_data, storage_id, on_durable, options
        )
        return self._save.path, storage_id

    def start(self, copy: bool) -> None:
        """Begin writing the queued save; `copy` snapshots its tensors first (see module doc)."""
        save = self._save
        if save is None or save.thread is not None:
            return
        if copy:
            save.payload = self._snapshots.copy(save.payload)
        save.thread = threading.Thread(
            target=save.run, name=f"checkpoint-{save.storage_id[:8]}", daemon=False
        )
        wait_at_exit(save.thread)
        save.thread.start()

    def poll(self) -> None:
        """Finish the save in flight if its write is done (runs its callback, raises its
        error)."""
        save = self._save
        if save is not None and save.done.is_set():
            self._finish(save)

    def wait(self) -> None:
        """Write the save in flight (uncopied, if it was not started) and block until it is
        durable; runs its callback, raises its error."""
        save = self._save
        if save is None:
            return
        self.start(copy=False)
        assert save.thread is not None
        save.thread.join()
        self._finish(save)

    def close(self) -> None:
        """Wait for the save in flight, then free the snapshots' memory (the end of a fit)."""
        try:
            self.wait()
        finally:
            self._snapshots.release()

    def _finish(self, save: _Save) -> None:
        self._save = None
        if save.error is not None:
            if not isinstance(save.error, BridgeError):  # those name the path already
                save.error.add_note(f"(while writing checkpoint {save.path} in the background)")
            raise save.error
        if save.on_durable is not None:
            save.on_durable(save.path)


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
