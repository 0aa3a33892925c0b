"""Running the Core API fixture scripts off-cluster as subprocesses, and reading back what
they reported (log lines) and stored (checkpoint folders): shared by the bridge's tests and
the interop tests that run the same script under Determined."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

from lightning_bridge.contract import _import_map
from tests._folders import GATE_CODE, cli_env, command, workspace

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "core_api"
REPO = pathlib.Path(__file__).resolve().parents[1]

# The reports a Core API script's off-cluster run logs, in Determined's words.
_REPORT = re.compile(
    r"(report_training_metrics|report_validation_metrics|report_metrics|report_progress"
    r"|progress report|SearcherOperation Complete|status|report_early_exit)\b(.*)$"
)


def run_script(
    script: str,
    args: list[str],
    work: pathlib.Path,
    *,
    bridge: bool = True,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """`python3 SCRIPT ARGS` in `work`: with the bridge's `determined` (`bridge`), or with the
    installed Determined."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["XDG_DATA_HOME"] = str(work / "xdg")
    path = [str(REPO)]
    if bridge:
        path.insert(0, str(_import_map.shim_dir(work)))
    env["PYTHONPATH"] = os.pathsep.join(path)
    result = subprocess.run(
        [python, str(FIXTURES / script), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def reports(output: str) -> list[str]:
    """The reports in a run's log, in order, without the logger's prefix."""
    found = []
    for line in output.splitlines():
        if not line.startswith("INFO: "):
            continue
        match = _REPORT.search(line)
        if match:
            found.append(match.group(1) + match.group(2))
    return found


def stored(root: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Each checkpoint folder under `root`: its files' bytes by relative path."""
    return {
        folder.name: {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        for folder in sorted(root.iterdir())
        if not folder.name.startswith(".")
    }


def seen(path: pathlib.Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# A Core API script for `lightning-bridge run`: a linear model trained by its own loop, `steps`
# batches (hyperparameters), reporting training and validation metrics every `every` batches
# and storing a checkpoint there, then asking should_preempt(). It continues from
# `latest_checkpoint`; `gate` / `hold_at` hold it at a batch (`GATE_CODE`: the test's gate);
# `invalid` raises InvalidHP. With several processes (torchrun) every process trains the same
# model on its own share of each batch and averages gradients (gloo), and stores its shard of
# each checkpoint (`shard=True`). It writes what it saw to `seen.<rank>.json` in its run folder.
CORE_TRAIN = (
    """
import json
import logging
import os
import pathlib
import sys

import torch
import torch.distributed as dist

import determined as det
from determined import core
"""
    + GATE_CODE
    + """

def batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [3.0], [0.5]]) + 0.1
    return x, y


def main(core_context, info):
    hp = info.trial.hparams
    d = core_context.distributed
    if hp.get("invalid"):
        raise det.InvalidHP("invalid=true cannot train")
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=hp["lr"])
    start = 0
    seen = {"latest": info.latest_checkpoint, "trained": [], "preempted_at": None,
            "best": core_context.train.get_experiment_best_validation(), "ops": [],
            "metadata": core_context.train.get_metadata()}
    starts = (seen["metadata"] or {}).get("starts", 0) + 1
    if info.latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = torch.load(path / "state.pt")
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["steps"]
            seen["restored_files"] = sorted(p.name for p in path.iterdir())
    x, y = batches()
    steps, every = hp["steps"], hp["every"]
    for batch in range(start, steps):
        hold_at_gate(hp, batch)
        rows = slice((batch % 8) * 8, (batch % 8) * 8 + 8)
        xb, yb = x[rows], y[rows]
        share = len(xb) // d.size
        xb, yb = xb[d.rank * share:(d.rank + 1) * share], yb[d.rank * share:(d.rank + 1) * share]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        if d.size > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= d.size
        opt.step()
        seen["trained"].append(batch + 1)
        done = batch + 1
        if done % every == 0 or done == steps:
            with torch.no_grad():
                val = float(torch.nn.functional.mse_loss(model(x), y))
            if d.rank == 0:
                core_context.train.report_training_metrics(
                    steps_completed=done, metrics={"loss": float(loss)}
                )
                core_context.train.report_validation_metrics(
                    steps_completed=done, metrics={"val_loss": val}
                )
                core_context.train.report_metrics("extra", done, {"seen": done})
                core_context.train.report_progress(done / steps)
                core_context.train.set_status(f"trained {done} of {steps}")
                core_context.train.set_metadata({"done": done, "starts": starts})
            metadata = {"steps_completed": done, "rank_%d" % d.rank: d.rank}
            with core_context.checkpoint.store_path(metadata, shard=d.size > 1) as (path, _):
                if d.rank == 0:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                "steps": done}, path / "state.pt")
                (path / f"shard.{d.rank}").write_text(str(done))
            if core_context.preempt.should_preempt():
                seen["preempted_at"] = done
                break
    seen["weights"] = [float(v) for v in torch.cat([p.flatten() for p in model.parameters()])]
    return seen


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "run it with lightning-bridge run"
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        distributed = core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        seen = main(core_context, info)
    # A script trains without Lightning: the Core API does not import it.
    seen["lightning"] = "lightning" in sys.modules
    run_dir = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent
    rank = distributed.rank if distributed is not None else 0
    with open(run_dir / f"seen.{rank}.jsonl", "a") as f:
        f.write(json.dumps(seen) + "\\n")
"""
)


def core_folder(root: pathlib.Path, name: str = "exp", **config: Any) -> pathlib.Path:
    """An experiment folder running `CORE_TRAIN` (`python3 train.py`): a single trial of 12
    batches, a report and checkpoint every 4, unless `config` changes it; the folder."""
    import yaml

    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(CORE_TRAIN)
    conf: dict[str, Any] = {
        "name": "core-api",
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": 0.05, "steps": 12, "every": 4},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 12}},
        "max_restarts": 0,
    }
    for key, value in config.items():
        if key == "hyperparameters":
            conf["hyperparameters"].update(value)
        else:
            conf[key] = value
    (folder / "const.yaml").write_text(yaml.safe_dump(conf))
    return folder


def seen_runs(run_dir: pathlib.Path, rank: int = 0) -> list[dict[str, Any]]:
    """What each run of the script's process `rank` saw, in order."""
    path = run_dir / f"seen.{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lb(folder: pathlib.Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`lightning-bridge ARGS --workspace` the folder's workspace, to its end (at most
    `timeout` seconds)."""
    return subprocess.run(
        command(*args, "--workspace", str(workspace(folder))),
        cwd=folder,
        env=cli_env(folder),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def described(folder: pathlib.Path, experiment: int = 1, timeout: float = 300) -> dict[str, Any]:
    """`experiment describe --json` of the folder's workspace."""
    done = lb(folder, "experiment", "describe", str(experiment), "--json", timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data
