"""The Slurm launcher against the local one: time from the command to the trial's first
batch, and the coordinator's own CPU while the trial trains.

It starts the two-node test cluster of `tests/_slurm_cluster.py` (root, Debian's slurm-wlm
and munge), then runs the same one-trial experiment (a linear trial, 40 batches, 0.1 s each)
with `--launcher local` and `--launcher slurm`, `--rounds` times each, interleaved. First
batch: the trial's first training report (`scheduling_unit: 1`) minus the command's start.
Coordinator CPU: the `run` process's user + system seconds (with the local launcher the trial
trains in it, so it is the training's CPU; with Slurm only submitting and polling). Run
`python bench/launchers.py [--rounds N] [--json FILE]`.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args()
    root = pathlib.Path(tempfile.mkdtemp(prefix="lb-bench-launchers-"))
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
