"""A search's coordinator cost: the gap between trials, and the CPU it uses while they train.

``lightning-bridge run`` runs a random search of ``--trials`` trials, one at a time
(``max_concurrent_trials: 1``, so each trial's end is followed by the next one's start), on a
tiny trial that sleeps ``--delay`` seconds per batch (its training takes a known time and
almost no CPU). The bench watches from outside: every 20 ms it lists the coordinator's child
processes (``/proc/PID/task/PID/children``) and reads its own CPU time (``/proc/PID/stat``:
user + system, children not counted). Each trial writes when its first batch begins.

What is reported:

* **gap**: seconds from one trial's end (its process closes it in the search when its fit
  ends: the moment the searcher can hand out the next) to the next trial's process starting,
  as seen by the 20 ms poll: the coordinator's work between trials (noticing the pending
  trial, pulling it, recording it in the workspace, writing its run description, starting
  its process). Target: median < 1 s. Add the next trial's start-up to get from one trial's
  end to the next one's first batch.
* **start-up**: seconds from a trial's process starting to its first batch (the trial's own
  start-up: Python, torch, Lightning, the trial; not the coordinator's), for reading.
* **wind-down**: seconds from a trial's end in the search to its process exiting (recording
  its end, retention, the interpreter's exit), for reading; the next trial does not wait for
  it.
* **coordinator CPU**: the coordinator's CPU seconds while trials train (from the first
  trial's first batch to the last trial's end) over that wall time. Target: < 2 %.
* **peak memory**: each trial process's peak resident memory (VmHWM) and its largest
  proportional share (Pss, shared pages divided among the processes sharing them), sampled.

Each is measured twice in one invocation, paired on the same machine: with warm trial
processes (forked from a process that has imported torch and Lightning, the default) and cold
(`LIGHTNING_BRIDGE_COLD_TRIALS=1`: a new interpreter per trial). Targets for warm: start-up
median <= 1 s, wind-down median <= 0.5 s. `--digits` adds the digits example's
`adaptive_asha` search end to end (9 trials, 2 at a time), warm and cold; target warm <= 0.5x
cold. The load average is printed with the figures (the machine may be shared).

``--per-trial`` measures instead what a short trial costs in a search, and the per-batch cost
under it:

* **per trial**: a random search of ``--trials`` (6) trials of ``--batches`` (6) batches that do
  not sleep, one at a time, each with its validation and checkpoint at its end, warm; the
  search's wall time (the command's start to its exit) over the trials, split into the
  command's start to the first batch, each trial's first batch to its close in the search,
  one trial's close to the next one's first batch, and the last close to the command's exit.
  ``--baseline PATH`` runs the same search, interleaved, with another checkout of the package
  first on ``PYTHONPATH`` (before / after figures in one invocation).
* **per batch**: the tiny model of ``overhead.py`` (its workers: a raw PyTorch loop, the
  bridge, and Determined where it is installed; ``--per-batch-batches`` batches each, fresh
  processes, rounds interleaved): steady milliseconds per batch, and the whole run (start-up
  and the final validation and checkpoint included), each over the raw loop's.

Usage::

    python bench/search.py [--trials 5] [--batches 60] [--delay 0.05] [--digits] [--dir DIR]
        [--json FILE]
    python bench/search.py --per-trial [--trials 6] [--batches 6] [--rounds 3]
        [--baseline /path/to/other/checkout] [--per-batch-batches 300]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
from _harness import package_versions, verdict  # noqa: E402

MODEL_DEF = """
import os
import pathlib
import time

import torch
from determined import pytorch

FIRST = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent / "first_batch"


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.ones(4), torch.ones(1)


class SleepyTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

    def build_training_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=8)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if not FIRST.exists():
            FIRST.write_text(repr(time.time()))
        time.sleep(float(self.context.get_hparam("delay")))
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""

CONFIG = """
name: bench_search
entrypoint: model_def:SleepyTrial
hyperparameters:
  global_batch_size: 8
  delay: {delay}
  lr:
    type: log
    base: 10
    minval: -3
    maxval: -1
searcher:
  name: random
  metric: validation_loss
  max_trials: {trials}
  max_concurrent_trials: 1
  max_length:
    batches: {batches}
reproducibility:
  experiment_seed: 1
"""

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, own only


def _children(pid: int) -> set[int]:
    try:
        text = pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(c) for c in text.split()}


def _closed(workspace: pathlib.Path) -> list[float]:
    """When each trial of the search was closed in it (Optuna's completion time)."""
    import optuna

    from lightning_bridge.record._registry import Registry

    with Registry(workspace) as registry:
        name = registry.experiment(1).options["search"]["name"]
    journal = workspace / "experiments" / "1" / "search.journal"
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name=name, storage=optuna.storages.JournalStorage(backend))
    return sorted(t.datetime_complete.timestamp() for t in study.trials if t.datetime_complete)


def _trial_processes(coordinator: int) -> set[int]:
    """The coordinator's trial processes: its `_trial` children, and the children of its warm
    process (forked trials; the warm process itself is not a trial)."""
    found: set[int] = set()
    try:
        own = pathlib.Path(f"/proc/{coordinator}/cmdline").read_bytes()
    except OSError:
        return found
    for pid in _children(coordinator):
        try:
            command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if command == own:
            continue  # forked, not yet running its command: seen at the next poll
        if b"lightning_bridge.experiment.launch._warm" in command:
            found |= _children(pid)
        elif b"\x00_trial\x00" in command:
            found.add(pid)
    return found


def _memory(pid: int) -> tuple[int, int]:
    """A process's peak resident memory (VmHWM) and its proportional share now (Pss), kB."""
    peak = pss = 0
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
        for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return peak, pss


def _environment(cold: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    if cold:
        env["LIGHTNING_BRIDGE_COLD_TRIALS"] = "1"
    return env


def run(args: argparse.Namespace, work: pathlib.Path, cold: bool = False) -> dict[str, Any]:
    folder = work / "folder"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(MODEL_DEF)
    config = CONFIG.format(delay=args.delay, trials=args.trials, batches=args.batches)
    (folder / "search.yaml").write_text(config)
    workspace = work / "workspace"
    env = _environment(cold)
    command = [sys.executable, "-m", "lightning_bridge", "run", "search.yaml"]
    command += ["--workspace", str(workspace)]
    log = (work / "run.log").open("w")
    coordinator = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log)
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    memory: dict[int, tuple[int, int]] = {}  # pid -> (peak kB, largest Pss kB)
    cpu: list[tuple[float, float]] = []  # (time, coordinator CPU seconds)
    tick = 0
    commands: dict[int, bytes] = {}
    while coordinator.poll() is None:
        now = time.time()
        seconds = _cpu_seconds(coordinator.pid)
        if seconds is not None:
            cpu.append((now, seconds))
        children = _trial_processes(coordinator.pid)
        for pid in children - started.keys():
            started[pid] = now
            with contextlib.suppress(OSError):
                commands[pid] = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()[:200]
        for pid in started.keys() - children - ended.keys():
            ended[pid] = now
        tick += 1
        if tick % 5 == 0:  # every 0.1 s: reading smaps costs more than a poll
            for pid in children:
                peak, pss = _memory(pid)
                known = memory.get(pid, (0, 0))
                memory[pid] = (max(known[0], peak), max(known[1], pss))
        time.sleep(0.02)
    log.close()
    if coordinator.returncode != 0:
        raise RuntimeError(f"the search failed:\n{(work / 'run.log').read_text()[-3000:]}")
    firsts = sorted(
        float(path.read_text())
        for path in (workspace / "experiments").glob("*/trials/*/first_batch")
    )
    spans = sorted((started[p], ended.get(p, time.time())) for p in started)
    closed = _closed(workspace)
    if not len(spans) == len(firsts) == len(closed) == args.trials:
        raise RuntimeError(
            f"expected {args.trials} trials, saw {len(spans)} / {len(firsts)}: {commands}"
        )
    gaps = [nxt[0] - end for end, nxt in zip(closed, spans[1:], strict=False)]
    startups = [first - span[0] for first, span in zip(firsts, spans, strict=True)]
    winddowns = [span[1] - end for end, span in zip(closed, spans, strict=True)]
    begin, end = firsts[0], spans[-1][1]
    inside = [c for c in cpu if begin <= c[0] <= end]
    used = inside[-1][1] - inside[0][1] if len(inside) > 1 else 0.0
    return {
        "gaps_s": gaps,
        "startups_s": startups,
        "winddowns_s": winddowns,
        "coordinator_cpu_s": used,
        "training_wall_s": end - begin,
        "coordinator_cpu_share": used / (end - begin),
        "coordinator_cpu_total_s": cpu[-1][1] if cpu else None,
        "peak_rss_mb": [memory.get(p, (0, 0))[0] / 1024 for p in sorted(started)],
        "peak_pss_mb": [memory.get(p, (0, 0))[1] / 1024 for p in sorted(started)],
    }


def digits(work: pathlib.Path, cold: bool) -> float:
    """Seconds the digits example's adaptive_asha search takes end to end."""
    example = pathlib.Path(__file__).resolve().parent.parent / "examples" / "digits"
    folder = work / "digits"
    shutil.copytree(example, folder)
    command = [sys.executable, "-m", "lightning_bridge", "run", "adaptive.yaml"]
    command += ["--workspace", str(work / "digits-workspace")]
    begin = time.time()
    done = subprocess.run(command, cwd=folder, env=_environment(cold), capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"the digits search failed:\n{done.stderr.decode()[-3000:]}")
    return time.time() - begin


def _spread(values: list[float]) -> str:
    """Median [min-max] of a list."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def _print_run(name: str, result: dict[str, Any]) -> None:
    print(f"{name}:")
    print("  gap between trials (s): " + ", ".join(f"{g:.3f}" for g in result["gaps_s"]))
    print("  trial start-up (s):     " + ", ".join(f"{s:.2f}" for s in result["startups_s"]))
    print("  trial wind-down (s):    " + ", ".join(f"{s:.2f}" for s in result["winddowns_s"]))
    print("  peak RSS (MB):          " + ", ".join(f"{m:.0f}" for m in result["peak_rss_mb"]))
    print("  largest Pss (MB):       " + ", ".join(f"{m:.0f}" for m in result["peak_pss_mb"]))
    print(
        f"  coordinator CPU while trials train: {result['coordinator_cpu_s']:.2f} s over "
        f"{result['training_wall_s']:.1f} s"
    )


HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def per_trial(args: argparse.Namespace, work: pathlib.Path, repo: pathlib.Path) -> dict[str, Any]:
    """One warm search of short trials with `repo` first on PYTHONPATH: its wall time and
    where it went (see the module docstring)."""
    folder = work / "folder"
    folder.mkdir(parents=True)
    (folder / "model_def.py").write_text(MODEL_DEF)
    config = CONFIG.format(delay=0.0, trials=args.trials, batches=args.batches)
    (folder / "search.yaml").write_text(config)
    workspace = work / "workspace"
    env = _environment(cold=False)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "lightning_bridge", "run", "search.yaml"]
    command += ["--workspace", str(workspace)]
    with (work / "run.log").open("w") as log:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begin = time.time()
        done = subprocess.run(command, cwd=folder, env=env, stdout=log, stderr=log)
        end = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the search failed:\n{(work / 'run.log').read_text()[-3000:]}")
    firsts = sorted(
        float(path.read_text())
        for path in (workspace / "experiments").glob("*/trials/*/first_batch")
    )
    closed = _closed(workspace)
    if not len(firsts) == len(closed) == args.trials:
        raise RuntimeError(f"expected {args.trials} trials, saw {len(firsts)} / {len(closed)}")
    return {
        "wall_s": end - begin,
        # The whole search's CPU (the command, its warm process, the trials it reaped): a
        # figure the machine's load moves far less than the wall time.
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "per_trial_s": (end - begin) / args.trials,
        "to_first_batch_s": firsts[0] - begin,
        "trial_s": [c - f for f, c in zip(firsts, closed, strict=True)],
        "between_s": [f - c for c, f in zip(closed, firsts[1:], strict=False)],
        "after_last_s": end - closed[-1],
    }


def per_batch(args: argparse.Namespace, work: pathlib.Path, repo: pathlib.Path) -> dict[str, Any]:
    """The tiny model under overhead.py's workers (raw loop, bridge, Determined where
    installed), interleaved rounds: each run's steady ms per batch and whole run seconds."""
    variants = ["raw", "bridge"]
    if importlib.util.find_spec("determined") is not None:
        variants.append("reference")
    env = {"PYTHONPATH": os.pathsep.join([str(repo), str(HERE)])}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    work.mkdir(parents=True, exist_ok=True)
    for _, variant in h.interleaved(args.rounds, variants):
        worker = ["--worker", variant, "--model", "tiny", "--threads", "1"]
        worker += ["--batches", str(args.per_batch_batches)]
        runs[variant].append(
            h.launch(HERE / "overhead.py", worker, label=variant, work_dir=work, env=env)
        )
    return runs


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main_per_trial(args: argparse.Namespace) -> int:
    """--per-trial: the per-trial and per-batch figures (see the module docstring)."""
    versions = package_versions(["lightning-bridge", "optuna", "lightning", "torch", "determined"])
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    repos = {"this": ROOT}
    if args.baseline is not None:
        repos = {"baseline": args.baseline.resolve(), **repos}
    for repo in repos.values():
        # Each checkout's bytecode written first (as an installed package has it), so that
        # neither pays for compiling its modules in the rounds.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "lightning_bridge")])
    load = [os.getloadavg()[0]]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in repos}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or pathlib.Path(tmp)
        for rnd, name in h.interleaved(args.rounds, list(repos)):
            run_ = per_trial(args, root / f"{name}-{rnd}", repos[name])
            results[name].append(run_)
            print(
                f"  round {rnd + 1} {name:<8} {run_['wall_s']:6.2f} s, "
                f"{run_['per_trial_s']:.2f} s a trial",
                flush=True,
            )
        load.append(os.getloadavg()[0])
        batches = per_batch(args, root / "per-batch", ROOT) if args.per_batch_batches else {}
        load.append(os.getloadavg()[0])
    print(
        f"1-minute load average: {' -> '.join(f'{x:.2f}' for x in load)} (cores: {os.cpu_count()})"
    )
    print(
        f"random search of {args.trials} trials x {args.batches} batches, one at a time, "
        f"a validation and a checkpoint per trial, warm; medians of {args.rounds} round(s), s"
    )
    print(
        f"{'checkout':<10}{'per trial':>10}{'wall':>8}{'CPU':>8}{'to 1st batch':>14}{'trial':>8}"
        f"{'between':>9}{'after last':>12}"
    )
    for name, runs in results.items():
        row = [
            _median([r["per_trial_s"] for r in runs]),
            _median([r["wall_s"] for r in runs]),
            _median([r["cpu_s"] for r in runs]),
            _median([r["to_first_batch_s"] for r in runs]),
            _median([x for r in runs for x in r["trial_s"]]),
            _median([x for r in runs for x in r["between_s"]]),
            _median([r["after_last_s"] for r in runs]),
        ]
        print(
            f"{name:<10}"
            + "".join(f"{v:>{w}.2f}" for v, w in zip(row, (10, 8, 8, 14, 8, 9, 12), strict=True))
        )
    if "baseline" in results:
        ratio = h.paired_median(
            [r["wall_s"] for r in results["this"]], [r["wall_s"] for r in results["baseline"]]
        )
        cpu = h.paired_median(
            [r["cpu_s"] for r in results["this"]], [r["cpu_s"] for r in results["baseline"]]
        )
        print(f"this / baseline (paired medians): wall time {ratio:.3f}, CPU {cpu:.3f}")
    ok = True
    this = _median([r["per_trial_s"] for r in results["this"]])
    passed, text = verdict(this, 1.0)
    ok = ok and passed
    print(f"per trial (this checkout) {this:.2f} s (target <= 1 s): {text}")
    if batches:
        raw = batches["raw"]
        print(
            f"per batch, tiny model, {args.per_batch_batches} batches, medians of "
            f"{args.rounds} round(s); ratios: paired medians over the raw loop"
        )
        print(
            f"{'variant':<10}{'ms/batch':>10}{'x raw':>8}{'run s':>8}{'x raw':>8}"
            f"{'run CPU s':>11}{'x raw':>8}"
        )
        for variant, runs in batches.items():
            steady = [r["ms_per_batch"] for r in runs]
            total = [r["total_s"] for r in runs]
            steady_x = h.paired_median(steady, [r["ms_per_batch"] for r in raw])
            total_x = h.paired_median(total, [r["total_s"] for r in raw])
            cpu = [r["cpu_total_s"] for r in runs]
            cpu_x = h.paired_median(cpu, [r["cpu_total_s"] for r in raw])
            print(
                f"{variant:<10}{_median(steady):>10.3f}{steady_x:>8.2f}"
                f"{_median(total):>8.3f}{total_x:>8.2f}{_median(cpu):>11.3f}{cpu_x:>8.2f}"
            )
        bridge_x = h.paired_median(
            [r["ms_per_batch"] for r in batches["bridge"]], [r["ms_per_batch"] for r in raw]
        )
        passed, text = verdict(bridge_x, 1.5)
        ok = ok and passed
        print(f"per batch bridge / raw loop {bridge_x:.2f} (target <= 1.5): {text}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"versions": versions, "load": load, "per_trial": results, "per_batch": batches},
                indent=1,
            )
        )
    return 0 if ok or not args.strict else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=None, help="5; --per-trial: 6")
    parser.add_argument("--batches", type=int, default=None, help="60; --per-trial: 6")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--digits", action="store_true", help="also the digits search")
    parser.add_argument("--dir", type=pathlib.Path, default=None)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 on a missed target")
    parser.add_argument("--per-trial", action="store_true", help="short trials' cost instead")
    parser.add_argument("--rounds", type=int, default=3, help="--per-trial: interleaved rounds")
    parser.add_argument(
        "--baseline",
        type=pathlib.Path,
        default=None,
        help="--per-trial: another checkout to compare, run interleaved",
    )
    parser.add_argument(
        "--per-batch-batches",
        type=int,
        default=300,
        help="--per-trial: batches per per-batch run (0: skip)",
    )
    args = parser.parse_args()
    if args.trials is None:
        args.trials = 6 if args.per_trial else 5
    if args.batches is None:
        args.batches = 6 if args.per_trial else 60
    if args.per_trial:
        return main_per_trial(args)
    versions = package_versions(["lightning-bridge", "optuna", "lightning", "torch"])
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dir or pathlib.Path(tmp)
        for name in ("warm", "cold"):
            results[name] = run(args, root / name, cold=name == "cold")
        if args.digits:
            for name in ("warm", "cold"):
                results[name]["digits_s"] = digits(root / name, cold=name == "cold")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"trials: {args.trials}, one at a time, {args.batches} batches of {args.delay} s each")
    for name in ("warm", "cold"):
        _print_run(name, results[name])
    warm, cold = results["warm"], results["cold"]
    print("                         warm                 cold")
    for key, label in (("startups_s", "start-up"), ("winddowns_s", "wind-down")):
        print(f"  {label:<12} (s)  {_spread(warm[key]):<20} {_spread(cold[key])}")
    for key, label in (("peak_rss_mb", "peak RSS"), ("peak_pss_mb", "largest Pss")):
        print(f"  {label:<12} (MB) {_spread(warm[key]):<20} {_spread(cold[key])}")
    checks = [
        ("median gap (warm)", statistics.median(warm["gaps_s"]), 1.0),
        ("coordinator CPU share (warm)", warm["coordinator_cpu_share"], 0.02),
        ("start-up median (warm)", statistics.median(warm["startups_s"]), 1.0),
        ("wind-down median (warm)", statistics.median(warm["winddowns_s"]), 0.5),
    ]
    if args.digits:
        ratio = warm["digits_s"] / cold["digits_s"]
        print(f"  digits adaptive_asha end to end: warm {warm['digits_s']:.1f} s, cold "
              f"{cold['digits_s']:.1f} s ({ratio:.2f}x)")  # fmt: skip
        checks.append(("digits search warm / cold", ratio, 0.5))
    ok = True
    for label, value, target in checks:
        passed, text = verdict(value, target)
        ok = ok and passed
        print(f"{label} {value:.3f} (target < {target:g}): {text}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"dir": None, "json": None},
                                         "versions": versions, **results}, indent=1))  # fmt: skip
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
