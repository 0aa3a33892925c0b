"""The Slurm launcher against the local one: time from the command to the trial's first
batch, and the coordinator's own CPU while the trial trains.

It starts the two-node test cluster of `tests/_slurm_cluster.py` (root, Debian's slurm-wlm
and munge), then runs the same one-trial experiment (a linear trial, 40 batches, 0.1 s each)
with `--launcher local` and `--launcher slurm`, `--rounds` times each, interleaved. First
batch: the trial's first training report (`scheduling_unit: 1`) minus the command's start.
Coordinator CPU: the `run` process's user + system seconds (with the local launcher the trial
trains in it, so it is the training's CPU; with Slurm only submitting and polling). Run
`python bench/slurm.py [--rounds N] [--json FILE]`.

`--search` compares, on the same cluster in one invocation, a random search of `--trials`
trials (2 at a time, 20 batches of 0.1 s) with one job per trial (`--launcher slurm`) against
two worker jobs that fork their trials from a warm process (`--launcher slurm --worker-jobs
2`). Per trial: launch to first batch, from the moment the trial appears in the record (the
coordinator records it just before `sbatch`; a worker just before forking it; polled every
50 ms) to its first training report (`scheduling_unit: 1`). Also the command's start to the
first trial's first batch, and the search's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from lightning_bridge.record._registry import Registry  # noqa: E402
from tests._folders import BASE_CONFIG  # noqa: E402
from tests._slurm_cluster import start_cluster  # noqa: E402
from tests.test_slurm import SLOW_MODEL_DEF  # noqa: E402


def _folder(root: pathlib.Path) -> pathlib.Path:
    folder = root / "exp"
    folder.mkdir(parents=True)
    (folder / "model_def.py").write_text(SLOW_MODEL_DEF)
    config = {
        **BASE_CONFIG,
        "hyperparameters": {**BASE_CONFIG["hyperparameters"], "delay": 0.1},
        "searcher": {**BASE_CONFIG["searcher"], "max_length": {"batches": 40}},
        "scheduling_unit": 1,
    }
    (folder / "const.yaml").write_text(yaml.safe_dump(config))
    return folder / "const.yaml"


def _one(config: pathlib.Path, launcher: str, workspace: pathlib.Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    command = [sys.executable, "-m", "lightning_bridge", "run", str(config)]
    command += ["--launcher", launcher, "--accelerator", "cpu", "--workspace", str(workspace)]
    subprocess.run(command, env=env, capture_output=True, check=True)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with Registry(workspace) as registry:
        first = registry.metrics(1, "training")[0].reported_at
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"first_batch_s": first - start, "wall_s": wall, "coordinator_cpu_s": cpu}


def _search_folder(root: pathlib.Path, trials: int) -> pathlib.Path:
    folder = root / "search"
    folder.mkdir(parents=True)
    (folder / "model_def.py").write_text(SLOW_MODEL_DEF)
    config = {
        **BASE_CONFIG,
        "hyperparameters": {**BASE_CONFIG["hyperparameters"], "delay": 0.1},
        "searcher": {
            "name": "random",
            "metric": "validation_loss",
            "max_trials": trials,
            "max_concurrent_trials": 2,
            "max_length": {"batches": 20},
        },
        "scheduling_unit": 1,
        "max_restarts": 0,
    }
    (folder / "const.yaml").write_text(yaml.safe_dump(config))
    return folder / "const.yaml"


def _search(config: pathlib.Path, extra: list[str], workspace: pathlib.Path) -> dict[str, Any]:
    """One search on the cluster; each trial's launch (first seen in the record) to its first
    batch, the command's start to the first batch, and the wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "lightning_bridge", "run", str(config), "--launcher"]
    command += ["slurm", "--accelerator", "cpu", "--workspace", str(workspace), *extra]
    start = time.time()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: dict[int, float] = {}
    registry_file = workspace / "registry.sqlite"
    while process.poll() is None:
        if registry_file.exists():
            try:
                with Registry(workspace) as registry:
                    ids = [t.id for t in registry.trials()]
            except Exception:  # noqa: BLE001 - the record being created
                ids = []
            now = time.time()
            for trial_id in ids:
                seen.setdefault(trial_id, now)
        time.sleep(0.05)
    wall = time.time() - start
    out = process.stdout.read().decode() if process.stdout else ""
    if process.returncode != 0:
        raise SystemExit(f"the search failed:\n{out[-4000:]}")
    firsts = {}
    with Registry(workspace) as registry:
        for trial in registry.trials():
            reports = registry.metrics(trial.id, "training")
            if reports:
                firsts[trial.id] = reports[0].reported_at
    launch = sorted(firsts[t] - seen[t] for t in firsts if t in seen)
    return {
        "launch_to_first_batch_s": launch,
        "command_to_first_batch_s": min(firsts.values()) - start,
        "wall_s": wall,
    }


def _search_main(args: argparse.Namespace) -> int:
    root = pathlib.Path(tempfile.mkdtemp(prefix="lb-bench-slurm-"))
    root.chmod(0o755)
    cluster = start_cluster(root / "cluster")
    os.environ.update(cluster.env)
    modes = {"job per trial": [], "2 worker jobs": ["--worker-jobs", "2"]}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        config = _search_folder(root, args.trials)
        for r in range(args.rounds):
            for mode in list(modes) if r % 2 == 0 else list(modes)[::-1]:
                ws = root / f"ws-{len(runs[mode])}-{mode.replace(' ', '-')}"
                runs[mode].append(_search(config, modes[mode], ws))
                print(mode, json.dumps(runs[mode][-1]), flush=True)
    finally:
        cluster.cancel_all()
        cluster.stop()
    print(f"random search of {args.trials} trials, 2 at a time, 20 batches of 0.1 s; seconds:")
    print(f"{'':14}  {'launch to first batch, median [min-max]':>40}  {'first':>6}  {'wall':>6}")
    for mode, done in runs.items():
        launch = [x for d in done for x in d["launch_to_first_batch_s"]]
        first = statistics.median(d["command_to_first_batch_s"] for d in done)
        wall = statistics.median(d["wall_s"] for d in done)
        spread = f"{statistics.median(launch):.2f} [{min(launch):.2f}-{max(launch):.2f}]"
        print(f"{mode:14}  {spread:>40}  {first:6.1f}  {wall:6.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--search", action="store_true", help="a search's trials (see above)")
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    if args.search:
        return _search_main(args)
    root = pathlib.Path(tempfile.mkdtemp(prefix="lb-bench-slurm-"))
    root.chmod(0o755)
    cluster = start_cluster(root / "cluster")
    os.environ.update(cluster.env)
    runs: dict[str, list[dict[str, float]]] = {"local": [], "slurm": []}
    try:
        config = _folder(root)
        for r in range(args.rounds):
            for launcher in ("local", "slurm") if r % 2 == 0 else ("slurm", "local"):
                ws = root / f"ws-{launcher}-{r}"
                runs[launcher].append(_one(config, launcher, ws))
                print(launcher, runs[launcher][-1], flush=True)
    finally:
        cluster.cancel_all()
        cluster.stop()
    print(f"{'launcher':8}  {'first batch s':>13}  {'wall s':>7}  {'coordinator CPU s':>17}")
    for launcher, done in runs.items():
        med = {k: statistics.median(d[k] for d in done) for k in done[0]}
        print(
            f"{launcher:8}  {med['first_batch_s']:13.1f}  {med['wall_s']:7.1f}  "
            f"{med['coordinator_cpu_s']:17.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
