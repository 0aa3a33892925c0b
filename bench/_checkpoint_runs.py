"""What `checkpoint.py` runs: the checkpointed trial, its clocks, and the fits and loads.

The trial (the same code on both frameworks) trains an MLP of `LAYERS` square `Linear` layers
with Adam. Its callback and its training step read the clock: a save starts at the
callback's `on_checkpoint_save_start`, and training is blocked until the next training step
begins. The callback implements no hook that reads a written checkpoint
(`on_checkpoint_write_end`, ...), so the bridge writes its checkpoints in the background.
The bridge's internals are timed by wrapping three of its functions (a `perf_counter` pair
each, behaviour unchanged): when `latest` has moved (the save is durable), the fsync, and the
checkpoint read of a resumed fit.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import _harness as h
import numpy as np
import torch
from torch import nn

import lightning_bridge
from lightning_bridge.checkpoint import _layout as bridge_layout
from lightning_bridge.translation.fit import _trainer_api as bridge_trainer

try:
    from determined import pytorch as det_pytorch
except ImportError:
    det_pytorch = None

SEED = 1234
LAYERS = 3
BATCH = 8


class Clock:
    """Readings of one fit: saves (blocked time, durability), resume phases."""

    def __init__(self) -> None:
        self.save_start: float | None = None
        self.save_starts: list[float] = []
        self.blocked: list[float] = []  # save start -> the next training step (not the last)
        self.durable_at: list[float] = []  # bridge: `latest` names the checkpoint
        self.fsync: list[float] = []  # bridge: fsync of the files and directory (background)
        self.written: list[float] = []  # reference: save start -> on_checkpoint_write_end
        self.read: list[float] = []  # resume: reading the checkpoint files
        self.load_start: float | None = None
        self.apply: list[float] = []  # resume: on_checkpoint_load_start -> on_training_start
        self.lock = threading.Lock()  # the bridge's writer thread appends too

    def durable(self) -> list[float]:
        """Save start -> durable, per save (bridge)."""
        return [end - start for start, end in zip(self.save_starts, self.durable_at, strict=False)]


ACTIVE: list[Clock] = []  # the clock of the fit in progress (at most one)


def _active() -> Clock | None:
    return ACTIVE[-1] if ACTIVE else None


@contextlib.contextmanager
def clocked(clock: Clock) -> Iterator[Clock]:
    ACTIVE.append(clock)
    try:
        yield clock
    finally:
        ACTIVE.pop()


def _timed(fn: Callable[..., Any], field: str, end_time: bool = False) -> Callable[..., Any]:
    """`fn`, appending its duration (or, `end_time`, when it ended) to the clock's `field`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock = _active()
            if clock is not None:
                end = time.perf_counter()
                with clock.lock:
                    getattr(clock, field).append(end if end_time else end - start)

    return wrapper


def instrument() -> None:
    """Time the bridge's `latest` pointer, fsync and checkpoint read (see module docstring)."""
    bridge_layout._write_latest = _timed(bridge_layout._write_latest, "durable_at", True)
    bridge_layout._fsync_tree = _timed(bridge_layout._fsync_tree, "fsync")
    bridge_trainer.read_checkpoint = _timed(bridge_trainer.read_checkpoint, "read")


@contextlib.contextmanager
def reference_torch_load_timed() -> Iterator[None]:
    """Time `torch.load` calls (the reference's resume path reads state_dict.pth with it)."""
    original = torch.load
    torch.load = _timed(original, "read")
    try:
        yield
    finally:
        torch.load = original


# --------------------------------------------------------------------------------------------
# The trial (same code on both frameworks).


def _step_begins(batch_idx: int) -> None:
    clock = _active()
    if clock is not None and clock.save_start is not None:
        clock.blocked.append(time.perf_counter() - clock.save_start)
        clock.save_start = None


def _make_callbacks(api: ModuleType) -> dict[str, Any]:
    class Timing(api.PyTorchCallback):  # type: ignore[name-defined]
        def on_training_start(self) -> None:
            clock = _active()
            if clock is not None and clock.load_start is not None:
                clock.apply.append(time.perf_counter() - clock.load_start)
                clock.load_start = None
            os.sync()  # earlier fits' dirty pages are flushed outside every timed window

        def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
            clock = _active()
            if clock is not None:
                clock.load_start = time.perf_counter()

        def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
            clock = _active()
            if clock is not None:
                clock.save_start = time.perf_counter()
                clock.save_starts.append(clock.save_start)

    class WriteTiming(Timing):
        # The reference only: how long its (synchronous) save takes until written.
        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            clock = _active()
            if clock is not None and clock.save_start is not None:
                clock.written.append(time.perf_counter() - clock.save_start)

    return {"timing": Timing() if api is lightning_bridge else WriteTiming()}


def recipe(width: int) -> h.Recipe:
    return h.Recipe(
        model=lambda: h.mlp((width,) * (LAYERS + 1)),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-4),
        loss=nn.functional.mse_loss,
        train_data=lambda: h.random_pairs(8 * BATCH, width, width, seed=1),
        val_data=lambda: h.random_pairs(BATCH, width, width, seed=2),
        batch_size=BATCH,
        step_begins=_step_begins,
        callbacks=_make_callbacks,
    )


TRIALS: dict[tuple[str, int], type] = {}


def trial_class(name: str, width: int) -> type:
    """The bench trial for framework `name` ("bridge" / "reference") at `width`."""
    if (name, width) not in TRIALS:
        api = lightning_bridge if name == "bridge" else det_pytorch
        cls_name = f"{name.capitalize()}BigTrial{width}"
        TRIALS[(name, width)] = h.trial_class(api, recipe(width), cls_name, __name__)
    return TRIALS[(name, width)]


# --------------------------------------------------------------------------------------------
# Runs.


def _seed() -> None:
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)


def fit(
    name: str,
    width: int,
    storage: pathlib.Path,
    batches: int,
    period: int,
    latest_checkpoint: str | None = None,
) -> Clock:
    """Train `batches` batches with a checkpoint every `period`; returns the clock."""
    api = lightning_bridge if name == "bridge" else det_pytorch
    init: dict[str, Any] = {"exp_conf": {"data": {}}}
    if name == "bridge":
        init.update(accelerator="cpu", checkpoint_dir=storage)
    _seed()
    clock = Clock()
    fit_args = {
        "checkpoint_period": api.Batch(period),
        "checkpoint_policy": "none",
        "latest_checkpoint": latest_checkpoint,
    }
    with clocked(clock), contextlib.ExitStack() as stack:
        if name == "reference" and latest_checkpoint is not None:
            stack.enter_context(reference_torch_load_timed())
        hparams = {"global_batch_size": BATCH}
        trial = trial_class(name, width)
        h.fit_trial(api, trial, batches, hparams, report_every=period, fit=fit_args, **init)
    clock.save_start = None  # the final save is followed by no training step
    return clock


def checkpoint_dirs(storage: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints under `storage`, oldest first."""
    found = [p.parent for p in storage.rglob("state_dict.pth") if not p.parent.name.startswith(".")]
    return sorted(found, key=lambda p: (p / "state_dict.pth").stat().st_mtime)


def dir_bytes(path: pathlib.Path, exclude: str | None = None) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        if exclude is not None and pathlib.Path(root) == path and exclude in dirs:
            dirs.remove(exclude)
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def time_load(name: str, width: int, path: str, kwargs: dict[str, Any] | None) -> float:
    api = lightning_bridge if name == "bridge" else det_pytorch
    _seed()
    gc.collect()
    start = time.perf_counter()
    trial = api.load_trial_from_checkpoint_path(
        path, trial_class=trial_class(name, width), torch_load_kwargs=kwargs
    )
    elapsed = time.perf_counter() - start
    del trial
    gc.collect()
    return elapsed
