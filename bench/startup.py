"""CPU a run spends starting its processes: `lightning-bridge run` of a Core API script, of a
trial class, and a small search of the script, against importing torch and Lightning alone.

Every figure is the CPU seconds (user + system) of the command's whole process tree, the
command, its trial processes and the script they start, taken from `RUSAGE_CHILDREN` around
each command. Rows of the same invocation, rounds interleaved:

- `import torch`, `import lightning`: a bare interpreter importing each, the floor a process
  that trains pays;
- `core api run`: `run const.yaml` of a Core API script (`det.core.init()`, two reported
  steps and a checkpoint), one process;
- `trial run`: the same with a `PyTorchTrial` class (a linear model, 4 batches);
- `core api search`: a random search of 3 trials of the script, one at a time.

With `--against REV` every run row is also measured on the package as it was at the git
revision REV (a temporary worktree on `PYTHONPATH`), and the ratio this tree / REV is printed:
how much of a run's start a change saved. Each row states how many `import lightning` it costs.

    python bench/startup.py [--rounds 3] [--against REV] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """\
import determined as det

with det.core.init() as core:
    for op in core.searcher.operations():
        for step in (1, 2):
            core.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0 / step})
        core.train.report_validation_metrics(steps_completed=2, metrics={"loss": 0.5})
        with core.checkpoint.store_path({"steps_completed": 2}) as (path, _):
            (path / "state.txt").write_text("2")
        op.report_completed(0.5)
"""

TRIAL = """\
import torch
from determined import pytorch


class Trial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _data(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
        data = torch.utils.data.TensorDataset(x, y)
        return pytorch.DataLoader(data, batch_size=8)

    def build_training_data_loader(self):
        return self._data()

    def build_validation_data_loader(self):
        return self._data()

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""


def _config(entrypoint: str, searcher: str) -> str:
    return (
        f"name: startup\nentrypoint: {entrypoint}\n"
        "hyperparameters:\n  lr: {type: double, minval: 0.01, maxval: 0.1}\n"
        f"searcher:\n{searcher}"
        "  metric: loss\n  smaller_is_better: true\n"
        "min_validation_period: {batches: 4}\n"
    )


SINGLE = "  name: single\n  max_length: {batches: 4}\n"
RANDOM = "  name: random\n  max_trials: 3\n  max_concurrent_trials: 1\n  max_length: {batches: 4}\n"


def _folder(root: pathlib.Path) -> pathlib.Path:
    folder = root / "experiment"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    (folder / "model_def.py").write_text(TRIAL)
    (folder / "core.yaml").write_text(_config("python3 train.py", SINGLE))
    (folder / "trial.yaml").write_text(_config("model_def:Trial", SINGLE))
    (folder / "search.yaml").write_text(_config("python3 train.py", RANDOM))
    return folder


def _cpu(command: list[str], cwd: pathlib.Path, env: dict[str, str]) -> float:
    """CPU seconds of `command`'s process tree (its waited-for descendants included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@contextlib.contextmanager
def _worktree(rev: str) -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="startup-against-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), rev], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
        )


RUNS = (
    ("core api run", "core.yaml"),
    ("trial run", "trial.yaml"),
    ("core api search", "search.yaml"),
)


def _measure(
    folder: pathlib.Path, trees: dict[str, pathlib.Path], rounds: int
) -> dict[str, list[float]]:
    """Every row's CPU seconds per round, rounds interleaved."""
    work = folder.parent
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "LIGHTNING_BRIDGE_"))}
    rows: dict[str, list[float]] = {}
    for round_ in range(rounds):
        for module in ("torch", "lightning"):
            command = [sys.executable, "-c", f"import {module}"]
            rows.setdefault(f"import {module}", []).append(_cpu(command, work, bare))
        for tree_name, tree in trees.items():
            env = {**bare, "PYTHONPATH": str(tree), "XDG_DATA_HOME": str(work / "xdg")}
            for row, config in RUNS:
                ws = work / f"ws-{round_}-{config}-{len(rows)}"
                command = [sys.executable, "-m", "lightning_bridge", "run", config]
                cpu = _cpu([*command, "--workspace", str(ws)], folder, env)
                rows.setdefault(f"{row} [{tree_name}]", []).append(cpu)
    return rows


def _report(rows: dict[str, list[float]], against: str | None) -> None:
    lightning = statistics.median(rows["import lightning"])
    print(f"{'row':34s} {'CPU s (median)':>15s} {'range':>13s} {'x import lightning':>19s}")
    for name, values in rows.items():
        med = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"{name:34s} {med:15.2f} {spread:>13s} {med / lightning:19.2f}")
    if against:
        print(f"\nthis tree / {against} (median of the per-round ratios, range):")
        for row, _ in RUNS:
            mine, theirs = rows[f"{row} [this tree]"], rows[f"{row} [{against}]"]
            ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
            med = statistics.median(ratios)
            print(f"  {row:18s} {med:.2f}  ({min(ratios):.2f}-{max(ratios):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="a git revision to compare the runs with")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = _folder(pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory())))
        trees = {"this tree": ROOT}
        if args.against:
            trees[args.against] = stack.enter_context(_worktree(args.against))
        rows = _measure(folder, trees, args.rounds)
    _report(rows, args.against)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
