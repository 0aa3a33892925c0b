"""How the bridge's costs grow: per-batch overhead with processes and aggregation, and
training blocked per checkpoint with the model's size.

* **Per-batch overhead**: the tiny model of ``overhead.py`` (where the loop's own cost
  dominates) trained by a hand-written loop (``raw``: DDP with ``no_sync`` on accumulating
  batches when there are several processes) and by the bridge, on 1 and 2 processes (gloo,
  CPU) and with ``aggregation_frequency`` 1 and 4 (``_scaling_worker``). The overhead is the
  bridge's steady-state cost per batch minus the raw loop's, in instructions where they can
  be counted (``_instructions``; rank 0's), in wall time otherwise; wall time is shown too.
* **Checkpoint blocked time**: ``checkpoint.py`` (saves and bytes only) at a 50 MB model
  (3 x Linear(2048, 2048)) and a 500 MB one (3 x Linear(6496, 6496)), both with Adam: the time
  training stands still per save, bridge and reference, and the bridge's time until the
  checkpoint is durable.

Usage::

    python bench/scaling.py [--part overhead|checkpoint|all] [--rounds 2] [--batches 500]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import _harness as h
import _instructions as instructions

CONFIGS = ((1, 1), (1, 4), (2, 1), (2, 4))  # (processes, aggregation_frequency)
WIDTHS = {"50 MB": 2048, "500 MB": 6496}
HERE = pathlib.Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    variant: str,
    processes: int,
    aggregation: int,
    batches: int,
    logs: pathlib.Path,
    counter: str | None,
) -> dict[str, Any]:
    """Start every rank of one run (each under the counter, if any); rank 0's results."""
    port = _free_port()
    procs, outputs = [], []
    for rank in range(processes):
        tag = f"{variant}-p{processes}-a{aggregation}-r{rank}-{time.monotonic_ns()}"
        result, out = logs / f"{tag}.json", logs / tag
        prefix: list[str] = []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
            GROUP_RANK="0", WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes),
        )  # fmt: skip
        if counter:
            prefix, extra = instructions.prefix(counter, out)
            env.update(extra)
        cmd = [*prefix, sys.executable, str(HERE / "scaling.py"), "--worker", variant]
        cmd += ["--batches", str(batches), "--aggregation", str(aggregation)]
        cmd += ["--result", str(result)]
        log = open(logs / f"{tag}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        outputs.append((result, out))
    for proc, log in procs:
        proc.wait(timeout=7200)
        log.close()
    failed = [p.returncode for p, _ in procs if p.returncode != 0]
    result, out = outputs[0]
    if failed or not result.exists():
        tail = pathlib.Path(procs[0][1].name).read_text().splitlines()[-30:]
        raise RuntimeError(f"{variant} x{processes} failed {failed}:\n" + "\n".join(tail))
    data: dict[str, Any] = json.loads(result.read_text())
    if counter:
        counts = instructions.read_counts(counter, out)
        data["steady_instructions"] = counts["steady"]
    return data


def overhead(args: argparse.Namespace, counter: str | None, logs: pathlib.Path) -> dict[str, Any]:
    """Per-batch cost of raw and bridge for every configuration (medians over rounds)."""
    timed: dict[tuple[int, int, str], list[float]] = {}
    counted: dict[tuple[int, int, str], list[float]] = {}
    configs = [c for c in CONFIGS if not args.configs or f"{c[0]}x{c[1]}" in args.configs]
    for rnd in range(args.rounds):
        for processes, aggregation in configs:
            for variant in h.rotated(["raw", "bridge"], rnd):
                key = (processes, aggregation, variant)
                run = run_ranks(variant, processes, aggregation, args.batches, logs, None)
                timed.setdefault(key, []).append(run["ms_per_batch"])
                line = f"{run['ms_per_batch']:7.3f} ms/batch"
                if counter:
                    run = run_ranks(variant, processes, aggregation, args.batches, logs, counter)
                    per_batch = run["steady_instructions"] / args.batches
                    counted.setdefault(key, []).append(per_batch)
                    line += f", {per_batch / 1e3:8.1f} k instructions/batch"
                print(f"  round {rnd + 1} x{processes} agg {aggregation} {variant:<6} {line}")
                sys.stdout.flush()
    rows = []
    print(f"\nper-batch cost, tiny model, {args.batches} batches, medians of {args.rounds} rounds")
    header = f"{'processes':>9} {'aggregation':>11} {'raw ms':>8} {'bridge ms':>10}"
    if counter:
        header += f" {'raw k instr':>12} {'bridge k':>9} {'overhead k':>11} {'ratio':>6}"
    print(header)
    for processes, aggregation in configs:
        raw_ms = statistics.median(timed[(processes, aggregation, "raw")])
        bridge_ms = statistics.median(timed[(processes, aggregation, "bridge")])
        row: dict[str, Any] = {"processes": processes, "aggregation": aggregation}
        row.update(raw_ms=raw_ms, bridge_ms=bridge_ms)
        line = f"{processes:>9} {aggregation:>11} {raw_ms:>8.3f} {bridge_ms:>10.3f}"
        if counter:
            raw_i = statistics.median(counted[(processes, aggregation, "raw")])
            bridge_i = statistics.median(counted[(processes, aggregation, "bridge")])
            row.update(raw_instructions=raw_i, bridge_instructions=bridge_i)
            line += (
                f" {raw_i / 1e3:>12.1f} {bridge_i / 1e3:>9.1f} {(bridge_i - raw_i) / 1e3:>11.1f}"
                f" {bridge_i / raw_i:>6.3f}"
            )
        print(line)
        rows.append(row)
    return {"rows": rows, "counter": counter}


def checkpoints(args: argparse.Namespace, logs: pathlib.Path) -> dict[str, Any]:
    """`checkpoint.py` (saves and bytes) at each model size."""
    out: dict[str, Any] = {}
    for label, width in WIDTHS.items():
        result = logs / f"checkpoint-{width}.json"
        cmd = [sys.executable, str(HERE / "checkpoint.py"), "--skip-loads", "--json", str(result)]
        cmd += ["--width", str(width), "--rounds", str(args.rounds), "--saves", "2"]
        cmd += ["--period", str(args.period)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not result.exists():
            raise RuntimeError(f"checkpoint.py --width {width} failed:\n{proc.stderr[-3000:]}")
        samples = json.loads(result.read_text())["samples"]
        out[label] = {
            key: statistics.median(samples[key])
            for key in (
                "blocked_s/bridge",
                "blocked_s/reference",
                "durable_s/bridge",
                "bytes/bridge",
            )
        }
        out[label]["paired"] = h.paired_median(
            samples["blocked_s/bridge"], samples["blocked_s/reference"]
        )
        print(f"  {label} done", flush=True)
    print(f"\ntraining blocked per save, medians of {args.rounds} rounds x 2 saves")
    print(f"{'model':>8} {'ckpt MB':>8} {'bridge ms':>10} {'reference ms':>13} {'ratio':>6} "
          f"{'bridge durable ms':>18}")  # fmt: skip
    for label, row in out.items():
        print(
            f"{label:>8} {row['bytes/bridge'] / 1e6:>8.0f} {row['blocked_s/bridge'] * 1e3:>10.1f}"
            f" {row['blocked_s/reference'] * 1e3:>13.1f} {row['paired']:>6.3f}"
            f" {row['durable_s/bridge'] * 1e3:>18.1f}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("overhead", "checkpoint", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--batches", type=int, default=500, help="batches per overhead run")
    parser.add_argument("--period", type=int, default=4, help="batches between saves")
    parser.add_argument("--counter", choices=("auto", "none"), default="auto")
    parser.add_argument(
        "--configs", nargs="+", choices=[f"{p}x{a}" for p, a in CONFIGS],
        help="overhead configurations, PROCESSESxAGGREGATION (default: all)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--worker", choices=("raw", "bridge"), help=argparse.SUPPRESS)
    parser.add_argument("--aggregation", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        from _scaling_worker import worker

        text = json.dumps(worker(args.worker, args.batches, args.aggregation))
        if args.result:
            pathlib.Path(args.result).write_text(text)
        return 0
    counter, why = instructions.available() if args.counter == "auto" else (None, "off")
    print(f"{os.cpu_count()} CPUs; instructions: {counter or 'not counted'} ({why})")
    load = [os.getloadavg()[0]]
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        if args.part in ("overhead", "all"):
            figures["overhead"] = overhead(args, counter, pathlib.Path(tmp))
        if args.part in ("checkpoint", "all"):
            figures["checkpoint"] = checkpoints(args, pathlib.Path(tmp))
    load.append(os.getloadavg()[0])
    print(f"(1-minute load average {load[0]:.2f} before, {load[1]:.2f} after)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({**figures, "load": load}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
