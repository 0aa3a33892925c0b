"""Checkpoint cost: training blocked per save, bytes, load and resume; bridge vs determined.

The model is three ``Linear(W, W)`` layers trained with Adam (``--width`` W, default 2048:
12,589,056 float32 parameters, 50.4 MB), so a checkpoint holds the weights plus Adam's two
moment tensors per parameter (twice the weights again) and its step counters: about 151 MB
in ``state_dict.pth`` at the default width. The same trial code (``_checkpoint_runs``) runs on
both frameworks, in one process, on the CPU; every round runs both, in alternating order,
after one unreported warm-up round.

What is measured, per framework:

* **blocked**: how long training stands still for a save: from the trial callback's
  ``on_checkpoint_save_start`` (the state dicts are collected just before it) to the start of
  the next training step. Each fit trains ``(saves + 1) x period`` batches with a checkpoint
  every ``period`` batches; the final checkpoint, after which no step follows, is not counted.
  The reference saves synchronously (``torch.save`` without fsync; its data reaches the disk
  later). The bridge copies the state off the model and writes, fsyncs and renames it in a
  background thread; its durability latency (save start until ``latest`` names the
  checkpoint) and the background fsync are shown for reading, and so is the reference's own
  save (until ``on_checkpoint_write_end``). Dirty pages are flushed (``os.sync()``) as each
  fit starts, outside every timed window.
* **load**: ``load_trial_from_checkpoint_path`` on each framework's own latest checkpoint,
  with the trial class passed explicitly. The bridge loads weights-only (its default). The
  reference's default weights-only load fails on its own checkpoints under torch >= 2.6
  (numpy's RNG state is pickled), so it is timed with ``torch_load_kwargs={"weights_only":
  False}``; the bridge with that same setting is shown for reading. Each round runs every load
  four times in rotating order (memory is collected before each).
* **resume**: the bridge's resume path, timed inside ``fit(latest_checkpoint=...)``: reading
  the checkpoint, then restoring it into the trial (``on_checkpoint_load_start`` to
  ``on_training_start``). The reference cannot resume from its own checkpoints under torch >=
  2.6, so its resume path is timed on the bridge's checkpoint instead.
* **bytes**: the checkpoint directory's files, excluding the reference's ``code/`` folder
  (reported separately). The bridge's ``latest`` pointer lives beside the checkpoint
  directories and is not counted.

Targets: blocked <= 0.5x the reference's, load and resume <= 1.0x, bytes <= 1.0x. Every
bridge sample has a reference partner taken in the same round (same save index, same load
repetition), and the machine drifts between rounds more than within one, so the verdict uses
the median of the paired ratios; the ratio of the two medians is printed beside it.

Usage::

    python bench/checkpoint.py [--rounds 5] [--saves 3] [--period 10] [--width 2048]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
from typing import Any

import _checkpoint_runs as runs
import _harness as h

LOADS = 4  # load_trial_from_checkpoint_path calls per framework and round
RESUMES = 3  # resumed fits per framework and round

ROWS: tuple[tuple[str, str, str, float | None], ...] = (
    # (label, key, unit, target)
    ("training blocked per save", "blocked_s", "ms", 0.5),
    ("load_trial_from_checkpoint_path", "load_s", "ms", 1.0),
    ("resume: read checkpoint", "resume_read_s", "ms", None),
    ("resume: restore into trial", "resume_apply_s", "ms", None),
    ("resume: read + restore", "resume_s", "ms", 1.0),
    ("checkpoint bytes (without code/)", "bytes", "MB", 1.0),
)

DETAILS: tuple[tuple[str, str, str], ...] = (
    ("bridge: save start -> durable", "durable_s/bridge", "ms"),
    ("bridge: fsync (in the background)", "fsync_s/bridge", "ms"),
    ("reference: save start -> written", "written_s/reference", "ms"),
    ("bridge load weights_only=False", "load_trusted_s/bridge", "ms"),
    ("reference code/ bytes", "code_bytes/reference", "B"),
)


def one_round(
    root: pathlib.Path,
    args: argparse.Namespace,
    bridge_first: bool,
    results: dict[str, list[float]],
) -> None:
    """Both frameworks: blocked time and bytes; then loads and both resume paths."""
    order = h.rotated(["bridge", "reference"], 0 if bridge_first else 1)
    batches = (args.saves + 1) * args.period
    last: dict[str, str] = {}
    for name in order:
        with h.reference_dirs(root / name) as storage:
            clock = runs.fit(name, args.width, storage, batches, args.period)
            assert len(clock.blocked) == args.saves, (name, clock.blocked)
            results[f"blocked_s/{name}"].extend(clock.blocked)
            if name == "bridge":
                assert len(clock.durable_at) == args.saves + 1, clock.durable_at
                results["durable_s/bridge"].extend(clock.durable())
                results["fsync_s/bridge"].extend(clock.fsync)
            else:
                results["written_s/reference"].extend(clock.written)
            path = runs.checkpoint_dirs(storage)[-1]
            last[name] = str(path)
            results[f"bytes/{name}"].append(float(runs.dir_bytes(path, exclude="code")))
            if (path / "code").is_dir():
                results[f"code_bytes/{name}"].append(float(runs.dir_bytes(path / "code")))
    if not args.skip_loads:
        _loads(root, args.width, last, bridge_first, results)
        _resumes(root, args, last["bridge"], order, results)
    shutil.rmtree(root)


def _loads(
    root: pathlib.Path,
    width: int,
    last: dict[str, str],
    bridge_first: bool,
    results: dict[str, list[float]],
) -> None:
    """Each framework's own latest checkpoint, LOADS times in rotating order."""
    loads: list[tuple[str, str, str, dict[str, Any] | None]] = [
        ("load_s/bridge", "bridge", last["bridge"], None),
        ("load_s/reference", "reference", last["reference"], {"weights_only": False}),
        ("load_trusted_s/bridge", "bridge", last["bridge"], {"weights_only": False}),
    ]
    if not bridge_first:
        loads.reverse()
    for i in range(LOADS):
        for key, name, ckpt, kwargs in h.rotated(loads, i):
            with h.reference_dirs(root / name):
                results[key].append(runs.time_load(name, width, ckpt, kwargs))


def _resumes(
    root: pathlib.Path,
    args: argparse.Namespace,
    checkpoint: str,
    order: list[str],
    results: dict[str, list[float]],
) -> None:
    """Both resume paths from the bridge's checkpoint, RESUMES times each, alternating."""
    batches = (args.saves + 1) * args.period + 1
    for i in range(RESUMES):
        for name in h.rotated(order, i):
            with h.reference_dirs(root / "bridge") as storage:
                before = set(runs.checkpoint_dirs(storage))
                ckpt = checkpoint if name == "bridge" else pathlib.Path(checkpoint).name
                resumed = runs.fit(
                    name, args.width, storage, batches, args.period, latest_checkpoint=ckpt
                )
                for extra in set(runs.checkpoint_dirs(storage)) - before:
                    shutil.rmtree(extra)  # the checkpoint each resumed fit ends with
            assert len(resumed.read) == 1 and len(resumed.apply) == 1, (name, resumed.__dict__)
            results[f"resume_read_s/{name}"].append(resumed.read[0])
            results[f"resume_apply_s/{name}"].append(resumed.apply[0])
            results[f"resume_s/{name}"].append(resumed.read[0] + resumed.apply[0])


def versions() -> dict[str, str]:
    dists = h.package_versions(("torch", "lightning", "determined", "lightning-bridge", "numpy"))
    python = {"python": platform.python_version(), "platform": platform.platform()}
    return {**python, **dists, "cpus": str(os.cpu_count())}


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value * 1e3:9.1f} ms"
    if unit == "MB":
        return f"{value / 1e6:9.3f} MB"
    return f"{value:9.0f} B "


def report(results: dict[str, list[float]]) -> tuple[str, bool, list[dict[str, Any]]]:
    lines = [
        f"{'':34} {'bridge':>12} {'reference':>12} {'ratio':>6} {'paired':>6} "
        f"{'range':>11} {'target':>6}  verdict",
    ]
    all_pass = True
    verdicts: list[dict[str, Any]] = []
    for label, key, unit, target in ROWS:
        b_samples, r_samples = results.get(f"{key}/bridge"), results.get(f"{key}/reference")
        if not b_samples or not r_samples:
            continue
        r = h.ratio_of_medians(b_samples, r_samples)
        paired = h.paired_median(b_samples, r_samples)
        if target is None:
            verdict, target_text = "(info)", "-"
        else:
            ok, verdict = h.verdict(paired, target)
            all_pass &= ok
            target_text = f"<={target:.2f}"
            verdicts.append({"label": label, "ratio": paired, "target": target, "met": ok})
        b, ref = statistics.median(b_samples), statistics.median(r_samples)
        lines.append(
            f"{label:34} {_fmt(b, unit):>12} {_fmt(ref, unit):>12} {r.value:6.3f} "
            f"{paired:6.3f} {r.span():>11} {target_text:>6}  {verdict}"
        )
    lines.append("")
    for label, key, unit in DETAILS:
        values = results.get(key) or []
        if values:
            spread = f"  [{_fmt(min(values), unit).strip()} - {_fmt(max(values), unit).strip()}]"
            lines.append(f"{label:34} {_fmt(statistics.median(values), unit):>12}{spread}")
    lines.append(
        "ratio: median(bridge) / median(reference); paired: median of the per-sample ratios "
        "(the verdict); range: min-max of the per-sample ratios"
    )
    return "\n".join(lines), all_pass, verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="reported rounds (after a warm-up)")
    parser.add_argument("--saves", type=int, default=3, help="timed saves per fit")
    parser.add_argument("--period", type=int, default=10, help="batches between saves")
    parser.add_argument("--width", type=int, default=2048, help="width of the square layers")
    parser.add_argument(
        "--skip-loads", action="store_true", help="only saves and bytes (no loads or resumes)"
    )
    parser.add_argument("--dir", default=None, help="where checkpoints are written (a temp dir)")
    parser.add_argument("--json", default=None, help="also write the raw samples here")
    args = parser.parse_args(argv)
    if runs.det_pytorch is None:
        print("determined is not installed: this benchmark compares against it.", file=sys.stderr)
        return 2
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    # The trusted-load warning (bridge) and the shared_fs notice (reference) repeat every round.
    logging.getLogger("lightning_bridge").setLevel(logging.ERROR)
    logging.getLogger("determined").setLevel(logging.ERROR)
    runs.instrument()
    n_params = runs.LAYERS * (args.width * args.width + args.width)
    base = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    results: dict[str, list[float]] = {}
    load = [os.getloadavg()[0]]
    try:
        for r in range(args.rounds + 1):
            samples: dict[str, list[float]] = {}
            for key in [f"{k}/{n}" for _, k, _, _ in ROWS for n in ("bridge", "reference")]:
                samples[key] = []
            for _, key, _ in DETAILS:
                samples[key] = []
            samples["code_bytes/bridge"] = []
            one_round(base / f"round{r}", args, bridge_first=r % 2 == 0, results=samples)
            if r == 0:
                continue  # warm-up
            for k, v in samples.items():
                results.setdefault(k, []).extend(v)
            print(f"round {r}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load.append(os.getloadavg()[0])
    info = versions()
    print(
        f"model: {runs.LAYERS} x Linear({args.width}, {args.width}) = {n_params:,} float32 "
        f"params ({n_params * 4 / 1e6:.1f} MB), Adam state (exp_avg, exp_avg_sq, step) per "
        "parameter"
    )
    print(
        f"{args.rounds} rounds (+1 warm-up); per fit {args.saves} timed saves, one every "
        f"{args.period} batches; medians; checkpoints under {args.dir or tempfile.gettempdir()}"
    )
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"1-minute load average {load[0]:.2f} before, {load[1]:.2f} after")
    text, all_pass, verdicts = report(results)
    print(text)
    print("ALL TARGETS PASS" if all_pass else "SOME TARGETS MISSED")
    if args.json:
        with open(args.json, "w") as f:
            out = {"versions": info, "args": vars(args), "load_average": load}
            json.dump({**out, "samples": results, "verdicts": verdicts}, f, indent=1)
    return 0 if all_pass else 1


if __name__ == "__main__":
    raise SystemExit(main())
