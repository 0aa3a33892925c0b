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
import importlib.metadata
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
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

import lightning_bridge
from lightning_bridge import _checkpoint as bridge_checkpoint
from lightning_bridge import _trainer as bridge_trainer

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


def _timed(fn: Callable[..., Any], field: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock = _active()
            if clock is not None:
                setattr(clock, field, getattr(clock, field) + time.perf_counter() - start)

    return wrapper


def _timed_into_list(fn: Callable[..., Any], field: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock = _active()
            if clock is not None:
                getattr(clock, field).append(time.perf_counter() - start)

    return wrapper


def instrument() -> None:
    """Time the bridge's fsync, `latest` pointer and checkpoint read (a perf_counter pair each;
    behaviour unchanged), and the reference's torch.load."""
    bridge_checkpoint._fsync_tree = _timed(bridge_checkpoint._fsync_tree, "_fsync_acc")
    bridge_checkpoint._write_latest = _timed(bridge_checkpoint._write_latest, "_latest_acc")
    bridge_trainer.read_checkpoint = _timed_into_list(bridge_trainer.read_checkpoint, "read")


@contextlib.contextmanager
def reference_torch_load_timed() -> Iterator[None]:
    """Time `torch.load` calls (the reference's resume path reads state_dict.pth with it)."""
    original = torch.load
    torch.load = _timed_into_list(original, "read")  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load = original  # type: ignore[assignment]


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


def _dataset(n: int, seed: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(
        torch.randn(n, WIDTH, generator=gen), torch.randn(n, WIDTH, generator=gen)
    )


class _BigBody:
    api: ClassVar[ModuleType]

    def __init__(self, context: Any) -> None:
        self.context = context
        layers: list[nn.Module] = []
        for i in range(LAYERS):
            layers.append(nn.Linear(WIDTH, WIDTH))
            if i < LAYERS - 1:
                layers.append(nn.ReLU())
        self.model = context.wrap_model(nn.Sequential(*layers))
        self.opt = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=1e-4))

    def build_callbacks(self) -> dict[str, Any]:
        return _make_callbacks(self.api)

    def build_training_data_loader(self) -> Any:
        return self.api.DataLoader(
            _dataset(8 * BATCH, 1), batch_size=self.context.get_per_slot_batch_size()
        )

    def build_validation_data_loader(self) -> Any:
        return self.api.DataLoader(_dataset(BATCH, 2), batch_size=BATCH)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}


class BridgeBigTrial(_BigBody, lightning_bridge.PyTorchTrial):
    api = lightning_bridge


if det_pytorch is not None:

    class ReferenceBigTrial(_BigBody, det_pytorch.PyTorchTrial):
        api = det_pytorch


# --------------------------------------------------------------------------------------------
# Runs.


@contextlib.contextmanager
def environment(workdir: pathlib.Path) -> Iterator[pathlib.Path]:
    """cwd and the user data directory (the reference's local checkpoint storage) side by side
    in `workdir`; the data directory is never inside cwd, which the reference copies into every
    checkpoint. Yields the checkpoint storage directory both frameworks use."""
    cwd, data = workdir / "cwd", workdir / "xdg_data"
    cwd.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    old_cwd, old_xdg = os.getcwd(), os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(data)
    os.chdir(cwd)
    try:
        yield data / "determined"
    finally:
        os.chdir(old_cwd)
        if old_xdg is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = old_xdg


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
    extra: dict[str, Any] = {}
    if is_bridge:
        extra = {
            "accelerator": "cpu",
            "checkpoint_dir": storage,
            "trainer_kwargs": {"enable_progress_bar": False, "enable_model_summary": False},
        }
    _seed()
    clock = Clock()
    with clocked(clock), contextlib.ExitStack() as stack:
        if not is_bridge and latest_checkpoint is not None:
            stack.enter_context(reference_torch_load_timed())
        with api.init(
            hparams={"global_batch_size": BATCH},
            exp_conf={"data": {}},
            enable_tensorboard_logging=False,
            **extra,
        ) as context:
            trial = trial_cls(context)
            api.Trainer(trial, context).fit(
                max_length=api.Batch(batches),
                checkpoint_period=api.Batch(1),
                reporting_period=api.Batch(1),
                checkpoint_policy="none",
                latest_checkpoint=latest_checkpoint,
            )
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
    order = ["bridge", "reference"] if bridge_first else ["reference", "bridge"]
    apis = {"bridge": lightning_bridge, "reference": det_pytorch}
    last: dict[str, str] = {}
    for name in order:
        workdir = root / name
        with environment(workdir) as storage:
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
        for key, api, path, kwargs in loads[i % len(loads) :] + loads[: i % len(loads)]:
            with environment(pathlib.Path(path).parents[2]):
                results[key].append(time_load(api, path, kwargs))
    # Resume paths, both from the bridge's checkpoint (the reference cannot read its own),
    # RESUMES times each in alternating order.
    for i in range(RESUMES):
        for name in order if i % 2 == 0 else order[::-1]:
            with environment(root / "bridge") as storage:
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
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "lightning", "determined", "lightning-bridge", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    out["cpus"] = str(os.cpu_count())
    return out


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


def paired_ratio(bridge: list[float], reference: list[float]) -> float:
    """Median of bridge / reference over paired samples (same round, same repetition)."""
    return statistics.median(b / r for b, r in zip(bridge, reference, strict=True))


def report(results: dict[str, list[float]]) -> tuple[str, bool]:
    lines = [
        f"{'':34} {'bridge':>12} {'reference':>12} {'ratio':>6} {'paired':>6} {'target':>6}  "
        "verdict",
    ]
    all_pass = True
    for label, key, unit, target in ROWS:
        b_samples, r_samples = results[f"{key}/bridge"], results[f"{key}/reference"]
        b, r = statistics.median(b_samples), statistics.median(r_samples)
        paired = paired_ratio(b_samples, r_samples)
        if target is None:
            verdict, target_text = "(info)", "-"
        else:
            ok = paired <= target
            all_pass &= ok
            verdict, target_text = ("PASS" if ok else "MISS"), f"<={target:.2f}"
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
