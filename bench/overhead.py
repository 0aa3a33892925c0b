"""Training-loop overhead: raw PyTorch, Lightning, a Fabric loop, lightning_bridge, determined.

Two models are trained for the same number of batches on the same in-memory data:

* ``tiny``: a 32->32->1 MLP, batch 32; the loop's own per-batch cost dominates.
* ``wide``: a 512->2048->2048->512 MLP, batch 32; the matrix products dominate (about 25 ms
  a batch on one thread of a small cloud CPU, against well under 1 ms of loop overhead).

Each model runs under five variants (``_overhead_worker``):

* ``raw``: a hand-written PyTorch loop (forward, backward, SGD step, zero_grad), with a
  loss average every 100 batches and a small validation pass at the end.
* ``lightning``: a plain ``LightningModule`` with manual optimization under
  ``lightning.Trainer(max_steps=...)``, no logger, checkpointing, progress bar or validation.
* ``fabric``: the raw loop as a ``lightning.Fabric`` user writes it (``fabric.setup``,
  ``setup_dataloaders``, ``fabric.backward``), ending with ``fabric.save`` of the model and
  optimizer.
* ``bridge``: a ``PyTorchTrial`` trained by ``lightning_bridge.Trainer.fit`` (reporting every
  100 batches, validation and checkpoint at the end, as Determined does).
* ``reference``: the same trial class code trained by ``determined.pytorch`` in local mode
  (skipped when ``determined`` is not importable).

Every run is a fresh subprocess with one torch thread. Timed runs measure wall time, CPU time
and peak RSS; the timed part starts after the imports and the data generation and ends when
training (and any final validation and checkpoint) is done. Counted runs measure the
instructions executed in the same part (``_instructions``: the CPU's counter through ``perf``
where readable, else valgrind's callgrind), split into start-up, steady batches and
wind-down; a machine's load does not move them, so they decide the speed targets. A counted
run may train fewer batches than a timed one (callgrind runs a wide batch in seconds): its
instructions for the timed run's length are then start-up + wind-down + that many batches at
its steady rate, each part counted. By default only the variants the speed targets compare
are counted (``--count-all``: every one). Rounds are interleaved: each round runs every variant
once, in a rotated order.

Usage::

    python bench/overhead.py [--batches 2000] [--rounds 3] [--count-rounds 2] [--quick]

One run of one variant, optionally under cProfile (for finding where the time goes)::

    python bench/overhead.py --worker bridge --model tiny --batches 2000 --profile bridge.prof
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import _harness as h
import _instructions as instructions
from _overhead_worker import MODELS, VARIANT_IMPORTS, VARIANTS, worker

# (label, model, numerator, denominator, basis, target). Basis "speed": instructions when
# counted, else wall time; "time": wall time; "rss": peak resident memory.
TARGETS: tuple[tuple[str, str, str, str, str, float], ...] = (
    ("tiny  bridge / reference", "tiny", "bridge", "reference", "speed", 0.95),
    ("tiny  bridge / fabric", "tiny", "bridge", "fabric", "speed", 1.05),
    ("wide  bridge / raw", "wide", "bridge", "raw", "speed", 1.02),
    ("tiny  RSS bridge / lightning", "tiny", "bridge", "lightning", "rss", 1.05),
    ("wide  RSS bridge / lightning", "wide", "bridge", "lightning", "rss", 1.05),
)
KEYS = {"time": "total_s", "cpu": "cpu_total_s", "rss": "peak_rss_mib", "instr": "instructions"}

Results = dict[tuple[str, str], list[dict[str, Any]]]


# --------------------------------------------------------------------------------------------
# Running the workers.
# --------------------------------------------------------------------------------------------


def available_variants() -> dict[str, str | None]:
    """Map each variant to None when runnable, else to the reason it is skipped."""
    out: dict[str, str | None] = {}
    for variant, modules in VARIANT_IMPORTS.items():
        missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
        out[variant] = f"{', '.join(missing)} not importable" if missing else None
    return out


def _at_length(counts: dict[str, int], batches: int, length: int) -> float:
    """Instructions for `length` batches from a counted run of `batches`: start-up, wind-down
    and `length` batches at the counted steady rate (the count itself when equal; perf gives
    only a total)."""
    if length == batches or "steady" not in counts:
        return float(counts["total"])
    steady = counts["steady"] / batches * length
    return float(counts.get("start-up", 0) + counts.get("wind-down", 0) + steady)


def run_rounds(
    rounds: int,
    models: Sequence[str],
    variants: Sequence[str],
    batches: int | dict[str, int],
    threads: int,
    logs: pathlib.Path,
    counter: str | None = None,
    length: int = 0,
    only: dict[str, list[str]] | None = None,
) -> Results:
    """Interleaved rounds of fresh worker processes (counted when `counter` is given; then
    `batches` may differ per model, and `instructions` is for `length` batches). `only`: the
    variants to run per model (default: all)."""
    results: Results = {}
    what = f"counted ({counter})" if counter else "timed"
    for rnd in range(rounds):
        for model in models:
            n = batches[model] if isinstance(batches, dict) else batches
            chosen = [v for v in variants if only is None or v in only.get(model, [])]
            for variant in h.rotated(chosen, rnd):
                prefix: list[str] = []
                env: dict[str, str] = {}
                out = logs / f"count-{model}-{variant}-{rnd}"
                if counter:
                    prefix, env = instructions.prefix(counter, out)
                args = ["--worker", variant, "--model", model, "--batches", str(n)]
                args += ["--threads", str(threads)]
                label = f"{model}/{variant}"
                run = h.launch(__file__, args, label=label, work_dir=logs, prefix=prefix, env=env)
                if counter:
                    counts = instructions.read_counts(counter, out)
                    if "total" not in counts:
                        raise RuntimeError(f"{label}: the counter recorded nothing in {out}")
                    run["phases"] = counts
                    run["instructions"] = _at_length(counts, n, length or n)
                results.setdefault((model, variant), []).append(run)
                detail = (
                    f"{run['phases']['total'] / 1e9:8.3f} G instructions in {n} batches"
                    if counter
                    else f"{run['total_s']:8.3f} s (CPU {run['cpu_total_s']:8.3f} s) "
                    f"{run['peak_rss_mib']:7.1f} MiB"
                )
                print(f"  {what} round {rnd + 1}/{rounds} {model:<5} {variant:<10} {detail}")
                sys.stdout.flush()
    return results


# --------------------------------------------------------------------------------------------
# Summaries.
# --------------------------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def print_time_table(results: Results, models: Sequence[str], variants: Sequence[str]) -> None:
    columns = (
        ("total s", "total_s", 9, 3),
        ("CPU s", "cpu_total_s", 9, 3),
        ("start-up s", "startup_s", 11, 3),
        ("ms/batch", "ms_per_batch", 10, 4),
        ("wind-down s", "winddown_s", 12, 3),
        ("peak RSS MiB", "peak_rss_mib", 13, 1),
    )
    header = f"{'model':<6}{'variant':<11}{'runs':>5}" + "".join(
        f"{title:>{width}}" for title, _, width, _ in columns
    )
    print("wall time and memory, medians per variant")
    print(header)
    print("-" * len(header))
    for model in models:
        for variant in variants:
            runs = results.get((model, variant), [])
            if runs:
                cells = "".join(
                    f"{_median(runs, key):>{width}.{digits}f}" for _, key, width, digits in columns
                )
                print(f"{model:<6}{variant:<11}{len(runs):>5}{cells}")
    print()


def print_count_table(
    counted: Results, models: Sequence[str], variants: Sequence[str], counter: str
) -> None:
    header = (
        f"{'model':<6}{'variant':<11}{'runs':>5}{'total G':>10}{'spread %':>10}"
        f"{'start-up M':>12}{'k / batch':>11}{'wind-down M':>13}"
    )
    print(
        f"instructions ({counter}) for the timed runs' length, medians per variant; spread: "
        "(max - min) / median"
    )
    print(header)
    print("-" * len(header))
    for model in models:
        for variant in variants:
            runs = counted.get((model, variant), [])
            if not runs:
                continue
            totals = [r["instructions"] for r in runs]
            med = statistics.median(totals)

            def phase(name: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r["phases"].get(name, 0) for r in runs)

            per_batch = phase("steady") / runs[0]["batches"]
            print(
                f"{model:<6}{variant:<11}{len(runs):>5}{med / 1e9:>10.3f}"
                f"{(max(totals) - min(totals)) / med * 100:>10.2f}{phase('start-up') / 1e6:>12.1f}"
                f"{per_batch / 1e3:>11.1f}{phase('wind-down') / 1e6:>13.1f}"
            )
    print()


def ratio(results: Results, model: str, num: str, den: str, key: str) -> tuple[h.Ratio, float]:
    """Ratio of medians with the per-round range, and the median of the paired ratios."""
    a = [r[key] for r in results[(model, num)]]
    b = [r[key] for r in results[(model, den)]]
    return h.ratio_of_medians(a, b), h.paired_median(a, b[: len(a)])


def judge(
    timed: Results, counted: Results, counter: str | None
) -> tuple[list[dict[str, Any]], bool]:
    """Print each target's verdict; returns the verdicts and whether all were met."""
    print("targets: paired median (the verdict), ratio of medians, [per-round min-max]")
    verdicts: list[dict[str, Any]] = []
    all_met = True
    for label, model, num, den, basis, target in TARGETS:
        source, key, name = timed, KEYS["time"], "time"
        if basis == "rss":
            key, name = KEYS["rss"], "RSS"
        elif basis == "speed" and counter and (model, num) in counted:
            source, key, name = counted, KEYS["instr"], "instructions"
        if (model, num) not in source or (model, den) not in source:
            print(f"  {label:<30} {'n/a':>34}  target <= {target:<5} SKIP")
            verdicts.append({"label": label, "basis": name, "ratio": None, "met": None})
            continue
        r, paired = ratio(source, model, num, den, key)
        met, word = h.verdict(paired, target)
        all_met &= met
        line = (
            f"  {label:<30} {name:<13}{paired:7.3f} {r.value:7.3f} [{r.span()}]"
            f"  target <= {target:<5} {word}"
        )
        if name == "time":
            cpu, _ = ratio(timed, model, num, den, KEYS["cpu"])
            line += f"   (CPU {cpu.value:.3f})"
        print(line)
        verdicts.append(
            {"label": label, "basis": name, "ratio": paired, "target": target, "met": met}
        )
    print()
    return verdicts, all_met


def print_against_reference(
    timed: Results, counted: Results, models: Sequence[str], variants: Sequence[str]
) -> None:
    """Every variant as a ratio of the reference, in time and (where counted) instructions."""
    for model in models:
        if (model, "reference") not in timed:
            continue
        print(f"{model}: each variant / reference (ratio of medians)")
        print(f"  {'variant':<11}{'time':>8}{'CPU':>8}{'instructions':>14}{'k instr/batch':>15}")
        for variant in variants:
            if (model, variant) not in timed:
                continue
            t, _ = ratio(timed, model, variant, "reference", KEYS["time"])
            c, _ = ratio(timed, model, variant, "reference", KEYS["cpu"])
            cells = f"  {variant:<11}{t.value:>8.3f}{c.value:>8.3f}"
            if (model, variant) in counted and (model, "reference") in counted:
                i, _ = ratio(counted, model, variant, "reference", KEYS["instr"])
                runs = counted[(model, variant)]
                steady = statistics.median(r["phases"]["steady"] / r["batches"] for r in runs)
                cells += f"{i.value:>14.3f}{steady / 1e3:>15.1f}"
            print(cells)
        print()


# --------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000, help="training batches per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument(
        "--count-rounds", type=int, default=2, help="interleaved counted rounds (0: none)"
    )
    parser.add_argument(
        "--count-batches", type=int, help="batches per counted tiny run (default: --batches)"
    )
    parser.add_argument(
        "--count-batches-wide", type=int, default=20,
        help="batches per counted wide run (callgrind runs a wide batch in seconds)",
    )  # fmt: skip
    parser.add_argument(
        "--count-models", nargs="+", choices=sorted(MODELS), default=list(MODELS),
        help="models whose runs are counted",
    )  # fmt: skip
    parser.add_argument(
        "--count-all", action="store_true",
        help="count every variant (default: those the speed targets compare)",
    )  # fmt: skip
    parser.add_argument(
        "--counter", choices=("auto", "perf", "callgrind", "none"), default="auto",
        help="instruction counter (auto: perf where readable, else callgrind, else none)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 batches, 1 round")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads in every variant (default 1: steadier on small machines)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write every run and the verdicts to this file")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a target is missed"
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="with --worker: write cProfile stats of the timed part")
    args = parser.parse_args(argv)

    if args.worker:
        if not args.model:
            parser.error("--worker needs --model")
        out = worker(args.worker, args.model, args.batches, args.threads, args.profile)
        text = json.dumps(out)
        if args.result:
            pathlib.Path(args.result).write_text(text)
        print(text)
        return 0

    batches, rounds, count_rounds = args.batches, args.rounds, args.count_rounds
    count_batches = args.count_batches or batches
    count_wide = args.count_batches_wide
    if args.quick:
        batches, rounds, count_rounds, count_batches = 300, 1, min(count_rounds, 1), 300
        count_wide = min(count_wide, 5)
    if batches < 1 or rounds < 1 or count_batches < 1 or count_wide < 1:
        parser.error("--batches, --rounds and --count-batches(-wide) must be at least 1")
    count_lengths = {"tiny": count_batches, "wide": count_wide}
    counter, why = instructions.available()
    if args.counter == "none":
        counter, why = None, "switched off (--counter none)"
    elif args.counter != "auto":
        counter, why = args.counter, "chosen with --counter"
    if count_rounds < 1:
        counter, why = None, "no counted rounds (--count-rounds 0)"
    status = available_variants()
    skipped = {v: why for v, why in status.items() if why is not None and v in args.variants}
    variants = [v for v in args.variants if status[v] is None]
    versions = h.package_versions(("torch", "lightning", "lightning-bridge", "determined"))
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
    )
    shapes = ", ".join(f"{m} {MODELS[m].dims} bs {MODELS[m].batch_size}" for m in args.models)
    print(f"models: {shapes}; threads={args.threads}")
    print(f"timed: {batches} batches x {rounds} round(s)")
    count_models = [m for m in args.count_models if m in args.models]
    count_only: dict[str, list[str]] | None = None
    if not args.count_all:
        count_only = {m: [] for m in count_models}
        for _, model, num, den, basis, _ in TARGETS:
            if basis == "speed" and model in count_only:
                count_only[model] += [v for v in (num, den) if v not in count_only[model]]
    if counter:
        print(
            f"counted ({counter}: {why}): {count_rounds} round(s); batches "
            + ", ".join(f"{m} {count_lengths[m]}" for m in count_models)
            + f", counts scaled to {batches} batches where fewer; variants "
            + (
                "all"
                if count_only is None
                else "; ".join(f"{m} {', '.join(v)}" for m, v in count_only.items())
            )
        )
    else:
        print(f"instructions not counted ({why}): per-batch verdicts use wall time")
    for variant, reason in skipped.items():
        print(f"note: {variant} skipped ({reason})")
    sys.stdout.flush()

    load: dict[str, float] = {"before": os.getloadavg()[0]}
    started = time.perf_counter()
    counted: Results = {}
    with tempfile.TemporaryDirectory(prefix="overhead-logs-") as tmp:
        logs = pathlib.Path(tmp)
        timed = run_rounds(rounds, args.models, variants, batches, args.threads, logs)
        load["after timed runs"] = os.getloadavg()[0]
        if counter and count_models:
            counted = run_rounds(
                count_rounds,
                count_models,
                variants,
                count_lengths,
                1,
                logs,
                counter,
                batches,
                only=count_only,
            )
            load["after counted runs"] = os.getloadavg()[0]
    print(
        f"(benchmark took {time.perf_counter() - started:.0f} s; 1-minute load average "
        + ", ".join(f"{v:.2f} {k}" for k, v in load.items())
        + f", on {os.cpu_count()} CPUs)\n"
    )
    print_time_table(timed, args.models, variants)
    if counter and counted:
        print_count_table(counted, count_models, variants, counter)
    print_against_reference(timed, counted, args.models, variants)
    verdicts, all_met = judge(timed, counted, counter)
    print("ALL TARGETS PASS" if all_met else "SOME TARGETS MISSED")
    if args.json:
        everything = [r for runs in timed.values() for r in runs]
        everything += [dict(r, counted=True) for runs in counted.values() for r in runs]
        pathlib.Path(args.json).write_text(
            json.dumps(
                {
                    "batches": batches,
                    "rounds": rounds,
                    "count_batches": count_lengths,
                    "count_rounds": count_rounds,
                    "counter": counter,
                    "threads": args.threads,
                    "load_average": load,
                    "versions": versions,
                    "runs": everything,
                    "verdicts": verdicts,
                    "skipped": skipped,
                },
                indent=1,
            )
        )
    return 1 if (args.strict and not all_met) else 0


if __name__ == "__main__":
    raise SystemExit(main())
