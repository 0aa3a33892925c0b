"""Launch to first batch of one trial on each launcher, cold and warm, in one invocation.

Rows (each against the local launcher's cold figure measured in the same invocation):

- local, cold: `lightning-bridge run single.yaml --launcher local` (a new process per trial);
- local, warm: a random search's trials on the local launcher (forked from its warm process);
- ray, cold: `run single.yaml --launcher ray --address ...` on the tests' two-node Ray cluster
  (`tests/_ray_cluster.py`: `ray start --head --block` and a worker `ray start --block
  --address` on 127.0.0.1, 2 CPUs each, own ports and temporary folders, stopped by pid:
  never `ray stop`, which would end every Ray cluster on the machine);
- ray, warm: the same search on that cluster (a node's trials after its first are forked from
  the node's `WarmNode` process);
- slurm, cold and warm: `--launcher slurm`, and `--worker-jobs 1` for the search, where Slurm's
  clients reach a cluster (`sinfo` answers as the environment is), else on the test cluster of
  `tests/_slurm_cluster.py` (root, Debian's `slurm-wlm` and `munge`); skipped with the reason
  printed where neither works.

The trial is `tests/_folders.py`'s `TinyTrial` (a linear model, 4 batches of 8 records) that
writes the time of its first `train_batch` call into its trial folder, and whether a warm
process forked it (its parent process is one: the `forked` column). **Launch to first
batch** (the figure of every row): from the moment the trial is asked for to that first
batch. Asked for: a cold trial by its command (the moment this script starts `run`: a cold
trial pays its command's start, imports, config checks and, on a cluster, the connection and
the placement or `sbatch`); a warm trial by its search's coordinator (the launcher writing the
trial's run description as it launches it, just before it forks, places or submits it). A
warm row counts the search's trials other than the first launched on each node (that one
starts the node's warm process or waits for its imports). `launch` beside it: from the run
description's writing to the first batch, for every row.

    python bench/launchers.py [--trials 4] [--rounds 1] [--no-ray] [--no-slurm] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from _harness import package_versions  # noqa: E402

from lightning_bridge.record._registry import Registry  # noqa: E402
from tests._folders import SEARCH_CONFIG, TINY, Trial, write_folder  # noqa: E402
from tests._ray_cluster import RayCluster  # noqa: E402
from tests._ray_cluster import start_cluster as start_ray_cluster  # noqa: E402

COMMAND_TIMEOUT_S = 300.0

# At its first batch the trial writes the time, and whether a warm process forked it (its
# parent is one), into its folder.
FIRST_BATCH = """\
        first = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent / "first_batch"
        if not first.exists():
            parent = pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
            forked = b"lightning_bridge.experiment.launch._warm" in parent
            first.write_text(json.dumps({"at": time.time(), "forked": forked}))
"""
_SLEEP = '        time.sleep(float(self.context.get_hparam("delay")))\n'
assert TINY.model_def.count(_SLEEP) == 1
TRIAL = Trial(TINY.model_def.replace(_SLEEP, FIRST_BATCH + _SLEEP), SEARCH_CONFIG)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One trial: seconds from its being asked for, and from its launch, to its first batch;
    whether a warm process forked it."""

    asked_s: float
    launch_s: float
    forked: bool


@dataclasses.dataclass
class Row:
    launcher: str
    mode: str  # cold | warm
    samples: list[Sample] = dataclasses.field(default_factory=list)


# ----- the experiment folders and what a run left ------------------------------------------


def _configs(root: pathlib.Path, trials: int) -> tuple[pathlib.Path, pathlib.Path]:
    """The one-trial config and the search's, in one folder with the trial's code."""
    common = {**SEARCH_CONFIG, "scheduling_unit": 4, "min_validation_period": {"batches": 4}}
    single = {
        **common,
        "name": "bench_single",
        "hyperparameters": {**SEARCH_CONFIG["hyperparameters"], "lr": 0.01},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}},
    }
    search = {
        **common,
        "name": "bench_search",
        "searcher": {
            "name": "random",
            "metric": "validation_loss",
            "max_trials": trials,
            "max_concurrent_trials": 2,
            "max_length": {"batches": 4},
        },
    }
    single_file = write_folder(root, single, "exp", TRIAL)
    search_file = single_file.with_name("search.yaml")
    search_file.write_text(yaml.safe_dump(search))
    return single_file, search_file


def _node(reason: str) -> str:
    """The Ray node a trial ran on, from its job's recorded reason ("" elsewhere: one node)."""
    found = re.search(r"\(node ([0-9a-f]+)\)", reason)
    return found.group(1) if found else ""


def _trials(workspace: pathlib.Path) -> list[tuple[float, dict[str, Any], str]]:
    """Each trial of the workspace's experiment: its launch (its run description's writing),
    what it wrote at its first batch, its node; in the order of their launch."""
    found = []
    with Registry(workspace) as registry:
        for trial in registry.trials():
            folder = pathlib.Path(trial.run_dir)
            first = folder / "first_batch"
            if not first.is_file():
                raise SystemExit(f"trial {trial.id} never trained (no {first})")
            job = registry.job(trial.id)
            launch = (folder / "run.json").stat().st_mtime
            found.append((launch, json.loads(first.read_text()), _node(job.reason if job else "")))
    return sorted(found, key=lambda t: t[0])


# ----- running `lightning-bridge run` ---------------------------------------------------------


def _environment(root: pathlib.Path, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LIGHTNING_BRIDGE_") and k != "RAY_ADDRESS"
    }
    env.update(PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(root / "data"), **extra)
    return env


def _run(
    config: pathlib.Path, workspace: pathlib.Path, args: list[str], env: dict[str, str]
) -> float:
    """`lightning-bridge run CONFIG --workspace WORKSPACE ARGS` to its end; the time it was
    started (SystemExit with its output's end when it fails or runs past the limit)."""
    command = [sys.executable, "-m", "lightning_bridge", "run", str(config)]
    command += ["--workspace", str(workspace), "--accelerator", "cpu", *args]
    log = workspace.with_name(workspace.name + ".log")
    with open(log, "wb") as out:
        started = time.time()
        process = subprocess.Popen(
            command,
            cwd=config.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    if code != 0:
        text = log.read_text(errors="replace")[-4000:]
        what = (
            f"exit code {code}" if code is not None else f"still running at {COMMAND_TIMEOUT_S} s"
        )
        raise SystemExit(f"{' '.join(command[2:])} failed ({what}):\n{text}")
    return started


def _cold(
    config: pathlib.Path, workspace: pathlib.Path, args: list[str], env: dict[str, str]
) -> Sample:
    started = _run(config, workspace, args, env)
    ((launch, first, _),) = _trials(workspace)
    return Sample(first["at"] - started, first["at"] - launch, first["forked"])


def _warm(
    config: pathlib.Path, workspace: pathlib.Path, args: list[str], env: dict[str, str]
) -> list[Sample]:
    """The search's trials other than the first launched on each node."""
    _run(config, workspace, args, env)
    seen: set[str] = set()
    samples = []
    for launch, first, node in _trials(workspace):
        if node in seen:
            samples.append(Sample(first["at"] - launch, first["at"] - launch, first["forked"]))
        seen.add(node)
    return samples


def _measure(
    rows: list[Row],
    launcher: str,
    files: tuple[pathlib.Path, pathlib.Path],
    root: pathlib.Path,
    args: list[str],
    env: dict[str, str],
    rounds: int,
) -> None:
    cold, warm = Row(launcher, "cold"), Row(launcher, "warm")
    rows += [cold, warm]
    for r in range(rounds):
        cold.samples.append(_cold(files[0], root / f"ws-{launcher}-cold-{r}", args, env))
        print(f"{launcher} cold, round {r + 1}: {cold.samples[-1]}", flush=True)
        extra = ["--worker-jobs", "1"] if launcher == "slurm" else []
        samples = _warm(files[1], root / f"ws-{launcher}-warm-{r}", args + extra, env)
        warm.samples += samples
        print(f"{launcher} warm, round {r + 1}: {samples}", flush=True)


# ----- the Ray cluster ------------------------------------------------------------------------


@contextlib.contextmanager
def _ray_cluster(root: pathlib.Path) -> Iterator[RayCluster]:
    """The tests' two-node Ray cluster (`tests/_ray_cluster.py`), stopped by pid at the end."""
    root.mkdir(parents=True)
    cluster = start_ray_cluster(root)
    try:
        yield cluster
    finally:
        cluster.stop_head()


# ----- Slurm ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _slurm(root: pathlib.Path) -> Iterator[dict[str, str] | str]:
    """The environment Slurm's clients need to reach a cluster: the one `sinfo` reaches as the
    environment is, else the test cluster (started here, stopped at the end); or why none."""
    if shutil.which("sinfo") is not None:
        done = subprocess.run(["sinfo", "--noheader"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            yield {}
            return
    try:
        from tests._slurm_cluster import ClusterUnavailable, start_cluster
    except ImportError as exc:
        yield f"the Slurm test cluster cannot be imported ({exc})"
        return
    try:
        cluster = start_cluster(root)
    except (ClusterUnavailable, OSError) as exc:
        yield f"no Slurm cluster answers (`sinfo`) and the test cluster cannot start: {exc}"
        return
    try:
        yield cluster.env
    finally:
        cluster.cancel_all()
        cluster.stop()


# ----- the table ------------------------------------------------------------------------------


def _table(rows: list[Row], skipped: list[str]) -> str:
    local = [r for r in rows if (r.launcher, r.mode) == ("local", "cold") and r.samples]
    base = statistics.median(s.asked_s for s in local[0].samples) if local else None
    lines = [
        f"{'launcher':8}  {'mode':4}  {'n':>2}  {'median s':>8}  {'min s':>6}  "
        f"{'vs local cold':>13}  {'launch: median s':>16}  {'forked':>6}"
    ]
    for row in rows:
        if not row.samples:
            lines.append(f"{row.launcher:8}  {row.mode:4}   0  (no trial counted)")
            continue
        asked = [s.asked_s for s in row.samples]
        median = statistics.median(asked)
        ratio = f"{median / base:.3f}x" if base else "-"
        launch = statistics.median(s.launch_s for s in row.samples)
        forked = f"{sum(s.forked for s in row.samples)}/{len(asked)}"
        lines.append(
            f"{row.launcher:8}  {row.mode:4}  {len(asked):>2}  {median:8.2f}  {min(asked):6.2f}  "
            f"{ratio:>13}  {launch:16.2f}  {forked:>6}"
        )
    lines += [f"skipped: {why}" for why in skipped]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="a warm row's search's trials")
    parser.add_argument("--rounds", type=int, default=1, help="cold runs and searches each")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-slurm", action="store_true")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args()
    began = time.monotonic()
    load = os.getloadavg()[0]
    root = pathlib.Path(tempfile.mkdtemp(prefix="lb-launchers-"))  # short: Ray's socket paths
    root.chmod(0o755)  # a Slurm job may run as another user
    print(f"runs in {root} (removed at the end, kept when a run fails)", flush=True)
    files = _configs(root, args.trials)
    rows: list[Row] = []
    skipped: list[str] = []
    local = ["--launcher", "local"]
    _measure(rows, "local", files, root, local, _environment(root, {}), args.rounds)
    if args.no_ray:
        skipped.append("ray rows (--no-ray)")
    elif importlib.util.find_spec("ray") is None:
        skipped.append(f"ray rows: Ray is not installed beside {sys.executable}")
    else:
        with _ray_cluster(root / "ray") as cluster:
            on_ray = ["--launcher", "ray", "--address", cluster.address]
            _measure(rows, "ray", files, root, on_ray, _environment(root, {}), args.rounds)
    if args.no_slurm:
        skipped.append("slurm rows (--no-slurm)")
    else:
        with _slurm(root / "slurm") as reached:
            if isinstance(reached, str):
                skipped.append(f"slurm rows: {reached}")
            else:
                on_slurm = ["--launcher", "slurm"]
                env = _environment(root, reached)
                _measure(rows, "slurm", files, root, on_slurm, env, args.rounds)
    shutil.rmtree(root, ignore_errors=True)  # kept when something failed, for its logs
    versions = package_versions(["ray", "torch", "lightning"])
    print()
    print(
        f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; 1-minute load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"{time.monotonic() - began:.0f} s in all"
    )
    print(
        "launch to first batch, seconds: from the trial being asked for (cold: this script "
        "starting `run`;\nwarm: the coordinator writing the trial's run description as it "
        "launches it) to the trial's first train_batch.\n"
        f"warm: a random search of {args.trials} trials, 2 at a time, each node's first trial "
        "left out. launch: from the run\ndescription's writing, every row. forked: trials "
        "a warm process forked (the trial's parent is one)."
    )
    print(_table(rows, skipped))
    if args.json is not None:
        data = {f"{r.launcher} {r.mode}": [dataclasses.asdict(s) for s in r.samples] for r in rows}
        args.json.write_text(json.dumps({"rows": data, "skipped": skipped}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
