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

Usage::

    python bench/search.py [--trials 5] [--batches 60] [--delay 0.05] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
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


def run(args: argparse.Namespace, work: pathlib.Path) -> dict[str, Any]:
    folder = work / "folder"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(MODEL_DEF)
    config = CONFIG.format(delay=args.delay, trials=args.trials, batches=args.batches)
    (folder / "search.yaml").write_text(config)
    workspace = work / "workspace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    command = [sys.executable, "-m", "lightning_bridge", "run", "search.yaml"]
    command += ["--workspace", str(workspace)]
    log = (work / "run.log").open("w")
    coordinator = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=log)
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    cpu: list[tuple[float, float]] = []  # (time, coordinator CPU seconds)
    while coordinator.poll() is None:
        now = time.time()
        seconds = _cpu_seconds(coordinator.pid)
        if seconds is not None:
            cpu.append((now, seconds))
        children = _children(coordinator.pid)
        for pid in children - started.keys():
            started[pid] = now
        for pid in started.keys() - children - ended.keys():
            ended[pid] = now
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
        raise RuntimeError(f"expected {args.trials} trials, saw {len(spans)} / {len(firsts)}")
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
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--dir", type=pathlib.Path, default=None)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--strict", action="store_true", help="exit 1 on a missed target")
    args = parser.parse_args()
    versions = package_versions(["lightning-bridge", "optuna", "lightning", "torch"])
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, args.dir or pathlib.Path(tmp))
    gap = statistics.median(result["gaps_s"])
    share = result["coordinator_cpu_share"]
    print(f"trials: {args.trials}, one at a time, {args.batches} batches of {args.delay} s each")
    print("gap between trials (s):    " + ", ".join(f"{g:.3f}" for g in result["gaps_s"]))
    print("trial start-up (s):        " + ", ".join(f"{s:.2f}" for s in result["startups_s"]))
    print("trial wind-down (s):       " + ", ".join(f"{s:.2f}" for s in result["winddowns_s"]))
    print(
        f"coordinator CPU while trials train: {result['coordinator_cpu_s']:.2f} s over "
        f"{result['training_wall_s']:.1f} s"
    )
    ok_gap, gap_verdict = verdict(gap, 1.0)
    ok_cpu, cpu_verdict = verdict(share, 0.02)
    print(f"median gap {gap:.3f} s (target < 1 s): {gap_verdict}")
    print(f"coordinator CPU {100 * share:.2f} % (target < 2 %): {cpu_verdict}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"dir": None, "json": None},
                                         "versions": versions, **result}, indent=1))  # fmt: skip
    return 0 if (ok_gap and ok_cpu) or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
