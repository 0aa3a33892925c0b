"""Checkpoint cost: save time, load time and bytes, lightning_bridge vs determined (0.38.1).

The model is three ``Linear(2048, 2048)`` layers (12,589,056 float32 parameters, 50.4 MB)
trained with Adam, so a checkpoint holds the weights plus Adam's two moment tensors per
parameter (``exp_avg``, ``exp_avg_sq``: twice the weights again) and its step counters: about
151 MB in ``state_dict.pth``. The same trial code runs on both frameworks, in one process, on
the CPU; every round runs both, in alternating order, after one unreported warm-up round.

What is measured, per framework:

* **save**: wall time from the trial callback's ``on_checkpoint_save_start`` to its
  ``on_checkpoint_write_end`` (both frameworks fire the pair around their save path; the state
  dicts are collected just before the first). For the bridge this includes writing the files
  to a temporary directory, fsyncing every file and the directory, the atomic rename into
  place and the ``latest`` pointer: the durability is part of the product's cost. The
  reference does not fsync (its data reaches the disk later, outside any timing), writes its
  ``metadata.json`` after ``on_checkpoint_write_end`` (a few hundred bytes) and copies the
  working directory into ``code/`` before ``on_checkpoint_save_start`` (here an empty
  directory). Dirty pages are flushed (``os.sync()``) outside the timed window before every
  save, so no save pays for an earlier one's writeback. Each fit writes ``--checkpoints``
  checkpoints (one after every batch).
* **load**: ``load_trial_from_checkpoint_path`` on each framework's own latest checkpoint,
  with the trial class passed explicitly (the bench's classes live in ``__main__``). The
  bridge loads weights-only (its default). The reference's default weights-only load fails on
  its own checkpoints under torch >= 2.6 (numpy's RNG state is pickled), so it is timed with
  ``torch_load_kwargs={"weights_only": False}``; the bridge with that same setting is shown
  for reading. Each round runs every load four times in rotating order (memory is collected
  before each), since a 200 MB allocation pattern makes single loads noisy. The file was just
  written, so it is read from the page cache on both sides.
* **resume**: the bridge's resume path, timed inside ``fit(latest_checkpoint=...)``: reading
  the checkpoint (``state_dict.pth`` weights-only and ``trial_state.pkl``), then restoring it
  into the trial (``on_checkpoint_load_start`` to ``on_training_start``: models, optimizer,
  RNG, callbacks, counters). The reference cannot resume from its own checkpoints under
  torch >= 2.6 (its weights-only ``torch.load`` refuses them), so its resume path is timed on
  the bridge's checkpoint instead (the same file the bridge resumes from): its ``torch.load``,
  then ``on_checkpoint_load_start`` to ``on_training_start``. Three resumed fits per framework
  and round, in alternating order.
* **bytes**: the checkpoint directory's files, excluding the reference's ``code/`` folder
  (reported separately). The bridge's ``latest`` pointer lives beside the checkpoint
  directories, not in them, and is not counted.

Targets: bridge / reference <= 1.0 for times, <= 1.05 for bytes. Every bridge sample has a
reference partner taken in the same round (same checkpoint index, same load repetition), and
the machine's state (page cache, memory, neighbours) drifts between rounds far more than within
one, so the verdict uses the median of the paired ratios; the ratio of the two medians is
printed beside it.

Usage::

    python bench/checkpoint.py [--rounds 7] [--checkpoints 2] [--dir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import pathlib
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import _harness as h
import numpy as np
import torch
from torch import nn

import lightning_bridge
from lightning_bridge.checkpoint import _layout as bridge_checkpoint
from lightning_bridge.translation import _trainer as bridge_trainer

try:
    from determined import pytorch as det_pytorch
except ImportError:
    det_pytorch = None

SEED = 1234
WIDTH = 2048
LAYERS = 3
BATCH = 8
LOADS = 4  # load_trial_from_checkpoint_path calls per framework and round
RESUMES = 3  # resumed fits per framework and round
TIME_TARGET = 1.0
SIZE_TARGET = 1.05


# --------------------------------------------------------------------------------------------
# Clocks shared by the trial callbacks and the wrapped bridge internals.


class Clock:
    """Readings of one fit: save durations, the bridge's save breakdown, resume phases."""

    def __init__(self) -> None:
        self.save_start: float | None = None
        self.saves: list[float] = []
        self.fsync: list[float] = []  # bridge: fsync of every file and of the directory
        self.latest: list[float] = []  # bridge: writing (and fsyncing) the `latest` pointer
        self.checkpoint_dirs: list[str] = []
        self.read: list[float] = []  # resume: reading the checkpoint files
        self.load_start: float | None = None
        self.apply: list[float] = []  # resume: on_checkpoint_load_start -> on_training_start
        self._fsync_acc = 0.0
        self._latest_acc = 0.0


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


def _timed(fn: Callable[..., Any], field: str, into_list: bool = False) -> Callable[..., Any]:
    """`fn`, adding its duration to the active clock's `field` (or appending it, `into_list`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock = _active()
            if clock is not None:
                elapsed = time.perf_counter() - start
                if into_list:
                    getattr(clock, field).append(elapsed)
                else:
                    setattr(clock, field, getattr(clock, field) + elapsed)

    return wrapper


def instrument() -> None:
    """Time the bridge's fsync, `latest` pointer and checkpoint read (a perf_counter pair each;
    behaviour unchanged), and the reference's torch.load."""
    bridge_checkpoint._fsync_tree = _timed(bridge_checkpoint._fsync_tree, "_fsync_acc")
    bridge_checkpoint._write_latest = _timed(bridge_checkpoint._write_latest, "_latest_acc")
    bridge_trainer.read_checkpoint = _timed(bridge_trainer.read_checkpoint, "read", into_list=True)


@contextlib.contextmanager
def reference_torch_load_timed() -> Iterator[None]:
    """Time `torch.load` calls (the reference's resume path reads state_dict.pth with it)."""
    original = torch.load
    torch.load = _timed(original, "read", into_list=True)
    try:
        yield
    finally:
        torch.load = original


# --------------------------------------------------------------------------------------------
# The trial (same code on both frameworks).


def _make_callbacks(api: ModuleType) -> dict[str, Any]:
    class Timing(api.PyTorchCallback):  # type: ignore[name-defined]
        def on_training_start(self) -> None:
            clock = _active()
            if clock is not None and clock.load_start is not None:
                clock.apply.append(time.perf_counter() - clock.load_start)
                clock.load_start = None
            os.sync()

        def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
            clock = _active()
            if clock is not None:
                clock.load_start = time.perf_counter()

        def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
            clock = _active()
            if clock is not None:
                clock._fsync_acc = clock._latest_acc = 0.0
                clock.save_start = time.perf_counter()

        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            end = time.perf_counter()
            clock = _active()
            if clock is not None and clock.save_start is not None:
                clock.saves.append(end - clock.save_start)
                clock.fsync.append(clock._fsync_acc)
                clock.latest.append(clock._latest_acc)
                clock.checkpoint_dirs.append(checkpoint_dir)
                clock.save_start = None

        def on_checkpoint_upload_end(self, uuid: str) -> None:
            os.sync()  # the next save starts without dirty pages (outside the timed window)

    return {"timing": Timing()}


RECIPE = h.Recipe(
    model=lambda: h.mlp((WIDTH,) * (LAYERS + 1)),
    optimizer=lambda params: torch.optim.Adam(params, lr=1e-4),
    loss=nn.functional.mse_loss,
    train_data=lambda: h.random_pairs(8 * BATCH, WIDTH, WIDTH, seed=1),
    val_data=lambda: h.random_pairs(BATCH, WIDTH, WIDTH, seed=2),
    batch_size=BATCH,
    callbacks=_make_callbacks,
)
BridgeBigTrial = h.trial_class(lightning_bridge, RECIPE, "BridgeBigTrial", __name__)
if det_pytorch is not None:
    ReferenceBigTrial = h.trial_class(det_pytorch, RECIPE, "ReferenceBigTrial", __name__)


# --------------------------------------------------------------------------------------------
# Runs.


def _seed() -> None:
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)


def fit(
    api: ModuleType,
    storage: pathlib.Path,
    batches: int,
    latest_checkpoint: str | None = None,
) -> Clock:
    """Train `batches` batches (a checkpoint after each); returns the clock's readings."""
    is_bridge = api is lightning_bridge
    trial_cls = BridgeBigTrial if is_bridge else ReferenceBigTrial
    init: dict[str, Any] = {"exp_conf": {"data": {}}}
    if is_bridge:
        init.update(accelerator="cpu", checkpoint_dir=storage)
    _seed()
    clock = Clock()
    fit_args = {
        "checkpoint_period": api.Batch(1),
        "checkpoint_policy": "none",
        "latest_checkpoint": latest_checkpoint,
    }
    with clocked(clock), contextlib.ExitStack() as stack:
        if not is_bridge and latest_checkpoint is not None:
            stack.enter_context(reference_torch_load_timed())
        hparams = {"global_batch_size": BATCH}
        h.fit_trial(api, trial_cls, batches, hparams, report_every=1, fit=fit_args, **init)
    return clock


def dir_bytes(path: pathlib.Path, exclude: str | None = None) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        if exclude is not None and pathlib.Path(root) == path and exclude in dirs:
            dirs.remove(exclude)
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def time_load(api: ModuleType, path: str, torch_load_kwargs: dict[str, Any] | None) -> float:
    trial_cls = BridgeBigTrial if api is lightning_bridge else ReferenceBigTrial
    _seed()
    gc.collect()
    start = time.perf_counter()
    trial = api.load_trial_from_checkpoint_path(
        path, trial_class=trial_cls, torch_load_kwargs=torch_load_kwargs
    )
    elapsed = time.perf_counter() - start
    del trial
    gc.collect()
    return elapsed


def one_round(
    root: pathlib.Path, checkpoints: int, bridge_first: bool, results: dict[str, list[float]]
) -> None:
    """Both frameworks: save, load, bytes; then both resume paths on the bridge's checkpoint."""
    order = h.rotated(["bridge", "reference"], 0 if bridge_first else 1)
    apis = {"bridge": lightning_bridge, "reference": det_pytorch}
    last: dict[str, str] = {}
    for name in order:
        workdir = root / name
        with h.reference_dirs(workdir) as storage:
            clock = fit(apis[name], storage, checkpoints)
            assert len(clock.saves) == checkpoints, (name, clock.saves)
            results[f"save_s/{name}"].extend(clock.saves)
            if name == "bridge":
                results["save_fsync_s/bridge"].extend(clock.fsync)
                results["save_latest_s/bridge"].extend(clock.latest)
                results["save_write_s/bridge"].extend(
                    s - f - w
                    for s, f, w in zip(clock.saves, clock.fsync, clock.latest, strict=True)
                )
            path = pathlib.Path(clock.checkpoint_dirs[-1])
            last[name] = str(path)
            results[f"bytes/{name}"].append(float(dir_bytes(path, exclude="code")))
            if (path / "code").is_dir():
                results[f"code_bytes/{name}"].append(float(dir_bytes(path / "code")))
            os.sync()
    # Loads, each on its framework's own latest checkpoint, LOADS times in rotating order.
    loads: list[tuple[str, ModuleType, str, dict[str, Any] | None]] = [
        ("load_s/bridge", lightning_bridge, last["bridge"], None),
        ("load_s/reference", det_pytorch, last["reference"], {"weights_only": False}),
        ("load_trusted_s/bridge", lightning_bridge, last["bridge"], {"weights_only": False}),
    ]
    if not bridge_first:
        loads.reverse()
    for i in range(LOADS):
        for key, api, ckpt, kwargs in h.rotated(loads, i):
            with h.reference_dirs(pathlib.Path(ckpt).parents[2]):
                results[key].append(time_load(api, ckpt, kwargs))
    # Resume paths, both from the bridge's checkpoint (the reference cannot read its own),
    # RESUMES times each in alternating order.
    for i in range(RESUMES):
        for name in h.rotated(order, i):
            with h.reference_dirs(root / "bridge") as storage:
                resumed = fit(
                    apis[name],
                    storage,
                    checkpoints + 1,
                    latest_checkpoint=last["bridge"]
                    if name == "bridge"
                    else pathlib.Path(last["bridge"]).name,
                )
            assert len(resumed.read) == 1 and len(resumed.apply) == 1, (name, resumed.__dict__)
            results[f"resume_read_s/{name}"].append(resumed.read[0])
            results[f"resume_apply_s/{name}"].append(resumed.apply[0])
            results[f"resume_s/{name}"].append(resumed.read[0] + resumed.apply[0])
            for extra in resumed.checkpoint_dirs:  # the checkpoint each resumed fit ends with
                shutil.rmtree(extra)
    shutil.rmtree(root)


def versions() -> dict[str, str]:
    dists = h.package_versions(("torch", "lightning", "determined", "lightning-bridge", "numpy"))
    python = {"python": platform.python_version(), "platform": platform.platform()}
    return {**python, **dists, "cpus": str(os.cpu_count())}


ROWS: tuple[tuple[str, str, str, float | None], ...] = (
    # (label, key, unit, target)
    ("save (save_start -> write_end)", "save_s", "ms", TIME_TARGET),
    ("load_trial_from_checkpoint_path", "load_s", "ms", TIME_TARGET),
    ("resume: read checkpoint", "resume_read_s", "ms", None),
    ("resume: restore into trial", "resume_apply_s", "ms", None),
    ("resume: read + restore", "resume_s", "ms", TIME_TARGET),
    ("checkpoint bytes (without code/)", "bytes", "MB", SIZE_TARGET),
)

DETAILS: tuple[tuple[str, str, str], ...] = (
    ("bridge save: fsync of files + dir", "save_fsync_s/bridge", "ms"),
    ("bridge save: latest pointer", "save_latest_s/bridge", "ms"),
    ("bridge save: write + rename (rest)", "save_write_s/bridge", "ms"),
    ("bridge load weights_only=False", "load_trusted_s/bridge", "ms"),
    ("reference code/ bytes", "code_bytes/reference", "B"),
)


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value * 1e3:9.1f} ms"
    if unit == "MB":
        return f"{value / 1e6:9.3f} MB"
    return f"{value:9.0f} B "


def report(results: dict[str, list[float]]) -> tuple[str, bool]:
    lines = [
        f"{'':34} {'bridge':>12} {'reference':>12} {'ratio':>6} {'paired':>6} {'target':>6}  "
        "verdict",
    ]
    all_pass = True
    for label, key, unit, target in ROWS:
        b_samples, r_samples = results[f"{key}/bridge"], results[f"{key}/reference"]
        b, r = statistics.median(b_samples), statistics.median(r_samples)
        paired = h.paired_median(b_samples, r_samples)
        if target is None:
            verdict, target_text = "(info)", "-"
        else:
            ok, verdict = h.verdict(paired, target)
            all_pass &= ok
            target_text = f"<={target:.2f}"
        lines.append(
            f"{label:34} {_fmt(b, unit):>12} {_fmt(r, unit):>12} {b / r:6.3f} {paired:6.3f} "
            f"{target_text:>6}  {verdict}"
        )
    lines.append("")
    for label, key, unit in DETAILS:
        values = results.get(key) or []
        if values:
            lines.append(f"{label:34} {_fmt(statistics.median(values), unit):>12}")
    lines.append(
        "ratio: median(bridge) / median(reference); paired: median of the per-sample ratios "
        "(the verdict)"
    )
    return "\n".join(lines), all_pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="reported rounds (after a warm-up)")
    parser.add_argument("--checkpoints", type=int, default=2, help="checkpoints per fit")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (a temp dir)")
    parser.add_argument("--json", default=None, help="also write the raw samples here")
    args = parser.parse_args(argv)
    if det_pytorch is None:
        print("determined is not installed: this benchmark compares against it.", file=sys.stderr)
        return 2
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    # The trusted-load warning (bridge) and the shared_fs notice (reference) repeat every round.
    logging.getLogger("lightning_bridge").setLevel(logging.ERROR)
    logging.getLogger("determined").setLevel(logging.ERROR)
    instrument()
    n_params = LAYERS * (WIDTH * WIDTH + WIDTH)
    base = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    results: dict[str, list[float]] = {}
    keys = [f"{k}/{n}" for _, k, _, _ in ROWS for n in ("bridge", "reference")]
    keys += [k for _, k, _ in DETAILS] + ["code_bytes/bridge"]
    try:
        for r in range(args.rounds + 1):
            samples: dict[str, list[float]] = {k: [] for k in keys}
            one_round(
                base / f"round{r}", args.checkpoints, bridge_first=r % 2 == 0, results=samples
            )
            if r == 0:
                continue  # warm-up
            for k, v in samples.items():
                results.setdefault(k, []).extend(v)
            print(f"round {r}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    info = versions()
    print(
        f"model: {LAYERS} x Linear({WIDTH}, {WIDTH}) = {n_params:,} float32 params "
        f"({n_params * 4 / 1e6:.1f} MB), Adam state (exp_avg, exp_avg_sq, step) per parameter"
    )
    print(
        f"{args.rounds} rounds (+1 warm-up), {args.checkpoints} checkpoints per fit, medians; "
        f"checkpoints under {args.dir or tempfile.gettempdir()}"
    )
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    text, all_pass = report(results)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": info, "samples": results}, f, indent=1)
    return 0 if all_pass else 1


if __name__ == "__main__":
    raise SystemExit(main())
