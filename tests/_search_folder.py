"""An experiment folder for the search tests: a tiny Determined trial, its config, and the
helpers that run `lightning-bridge` on it as a user would (subprocesses with time limits)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import yaml

# A trial written for Determined. Hyperparameters: `lr` (SGD), `delay` (seconds slept per
# batch, so a test can stop a search while it trains), `mode`: "invalid" raises InvalidHP in
# __init__, "crash" raises RuntimeError there. Each trial writes the seed it was given into
# its own folder (the folder of its run description).
MODEL_DEF = """
import json
import os
import pathlib
import time

import torch
from determined import InvalidHP, pytorch


class Data(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        mode = context.get_hparams().get("mode", "ok")
        if mode == "invalid":
            raise InvalidHP("mode=invalid cannot train")
        if mode == "crash":
            raise RuntimeError("deliberate crash in __init__")
        run_dir = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent
        (run_dir / "seen.json").write_text(json.dumps({"seed": context.get_trial_seed()}))
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        )

    def build_training_data_loader(self):
        return pytorch.DataLoader(Data(64), batch_size=8, shuffle=True)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(16), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
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

BASE: dict[str, Any] = {
    "name": "tiny_search",
    "entrypoint": "model_def:TinyTrial",
    "hyperparameters": {
        "global_batch_size": 8,
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1},
        "delay": 0.0,
    },
    "reproducibility": {"experiment_seed": 7},
    "scheduling_unit": 4,
    "max_restarts": 0,
}


def write_folder(folder: pathlib.Path, config: dict[str, Any], name: str = "search.yaml") -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(MODEL_DEF)
    (folder / name).write_text(yaml.safe_dump(config, sort_keys=False))
    return folder / name


def environment() -> dict[str, str]:
    """The command's environment: this interpreter's package, no Determined mapping left
    over from the test process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LIGHTNING_BRIDGE_") or k == "LIGHTNING_BRIDGE_MLFLOW"
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_bridge", *args]


def start(args: list[str], cwd: pathlib.Path, log: pathlib.Path) -> subprocess.Popen[bytes]:
    """`lightning-bridge ARGS` in a session of its own (a test signals or kills all of it),
    its output in `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command(*args),
            cwd=cwd,
            env=environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(process: subprocess.Popen[bytes], log: pathlib.Path, timeout: float = 300) -> str:
    """Wait for a started command (killing it and its trials past `timeout`); its output."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        raise AssertionError(f"timed out:\n{log.read_text()[-4000:]}") from None
    return log.read_text()


def wait_for(
    condition: Any,
    timeout: float,
    what: str,
    process: subprocess.Popen[bytes] | None = None,
    log: pathlib.Path | None = None,
) -> Any:
    """Poll `condition` until it is true; fail at `timeout`, or as soon as `process` ends
    (showing its `log`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process is not None and process.poll() is not None:
            shown = log.read_text()[-4000:] if log is not None else ""
            raise AssertionError(f"the command ended before {what}:\n{shown}")
        time.sleep(0.1)
    shown = log.read_text()[-4000:] if log is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{shown}")
