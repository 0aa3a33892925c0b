"""Experiment folders and process helpers for the fault tests (signals, bad directories).

The trial is written for Determined (`from determined import pytorch`; run as a plain script
without Determined installed, it takes the bridge) and is driven through hyperparameters:
`sleep` slows every batch so a signal lands mid-run, `mark_at` writes `training.<rank>` once
that many batches are trained (the test's cue to send the signal), `signal_at` makes rank 0
send SIGTERM to itself during that batch, `width` makes the model (and so every save) bigger,
`hold_save_at` holds the save after that many batches half-written (`saving` appears) until the
test creates `release`, `workers` gives the training data loader worker processes. Every
process writes `pid.<rank>`; every validation appends the batch count it followed to
`events.jsonl`. Runs of a folder keep their record in a workspace of its own beside it
(`<folder>-ws`: not inside it, where checkpoints would copy it with the code).
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import termios
import textwrap
import time
from typing import Any

import torch
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]

MODEL_DEF = """
import collections
import json
import os
import pathlib
import signal
import time

import torch

try:
    from determined import pytorch
except ImportError:  # a plain script without Determined installed
    import lightning_bridge as pytorch


class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Gate:
    # Pickled inside a save: holds it (its partial directory on disk) until `release`. It has
    # no state, so a background save's snapshot keeps it as it is (the hold happens while the
    # file is written, not while the state is copied off the trial).

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        pathlib.Path("saving").touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path("release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return (collections.OrderedDict, ())


class Log(pytorch.PyTorchCallback):
    def __init__(self, trial):
        self.trial = trial

    def state_dict(self):
        if self.trial.hp.get("hold_save_at") == self.trial.trained:
            return {"gate": Gate()}
        return {}

    def on_validation_end(self, metrics):
        if self.trial.context.distributed.rank == 0:
            with open("events.jsonl", "a") as f:
                event = {"batches": self.trial.trained, "val": float(metrics["validation_loss"])}
                f.write(json.dumps(event) + "\\n")


class FaultTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.hp = context.get_hparams()
        # The process's rank before any process group exists (Lightning's launcher sets
        # LOCAL_RANK for the processes it starts, torchrun sets both).
        self.rank = int(os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or 0)
        pathlib.Path(f"pid.{self.rank}").write_text(str(os.getpid()))
        torch.manual_seed(0)
        width = int(self.hp.get("width", 0))
        layers = [torch.nn.Linear(4, width), torch.nn.Linear(width, 1)] if width else [
            torch.nn.Linear(4, 1)
        ]
        self.model = context.wrap_model(torch.nn.Sequential(*layers))
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=self.hp.get("lr", 0.05))
        )
        self.trained = 0

    def build_callbacks(self):
        return {"log": Log(self)}

    def build_training_data_loader(self):
        return pytorch.DataLoader(
            Data(64, 0),
            batch_size=self.context.get_per_slot_batch_size(),
            num_workers=int(self.hp.get("workers", 0)),
        )

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(16, 1), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if self.hp.get("signal_at") == batch_idx and self.rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(float(self.hp.get("sleep", 0)))
        self.trained = batch_idx + 1
        if self.hp.get("mark_at") is not None and self.trained >= self.hp["mark_at"]:
            pathlib.Path(f"training.{self.rank}").touch()
        return {"loss": loss}

    def evaluation_reducer(self):
        return pytorch.Reducer.AVG

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""

# The same trial as a Trainer-API script: lengths from the config, like on a cluster.
TRAIN_PY = """
import determined as det
from determined import pytorch
from model_def import FaultTrial

info = det.get_cluster_info()
with pytorch.init() as ctx:
    trainer = pytorch.Trainer(FaultTrial(ctx), ctx)
    trainer.fit(
        validation_period=pytorch.Batch(4),
        latest_checkpoint=info.latest_checkpoint,
    )
"""

CONFIG: dict[str, Any] = {
    "name": "faults",
    "entrypoint": "model_def:FaultTrial",
    "hyperparameters": {"global_batch_size": 8},
    "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 40}},
    "min_validation_period": {"batches": 4},
    "reproducibility": {"experiment_seed": 3},
}


def write_folder(root: pathlib.Path, name: str = "exp", **changes: Any) -> pathlib.Path:
    """A fault-trial folder under `root` with `changes` to the config; returns the folder.

    `hyperparameters` in `changes` are added to the global batch size."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(textwrap.dedent(MODEL_DEF))
    (folder / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    config = json.loads(json.dumps(CONFIG))
    config["hyperparameters"].update(changes.pop("hyperparameters", {}))
    config.update(changes)
    (folder / "const.yaml").write_text(yaml.safe_dump(config))
    return folder


def workspace(folder: pathlib.Path) -> pathlib.Path:
    """The workspace (record, trial folders, checkpoints) of the folder's runs."""
    return folder.with_name(f"{folder.name}-ws")


def cli_env(folder: pathlib.Path) -> dict[str, str]:
    """The environment of a `lightning-bridge` run of `folder` started by a test: its own
    workspace, no launcher variables."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "LIGHTNING_BRIDGE_WORKSPACE": str(workspace(folder)),
    }
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "NODE_RANK"):
        env.pop(var, None)
    return env


def run_args(folder: pathlib.Path, *args: str) -> list[str]:
    """`main()`'s arguments for `run const.yaml ARGS` of `folder` in its own workspace."""
    return ["run", str(folder / "const.yaml"), "--workspace", str(workspace(folder)), *args]


def start_run(folder: pathlib.Path, *args: str) -> subprocess.Popen[str]:
    """`python -m lightning_bridge run const.yaml ARGS` in its own session (so a test can
    signal its whole process group, as a terminal's Ctrl-C would)."""
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_bridge", "run", "const.yaml", *args],
        cwd=folder,
        env=cli_env(folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_cli(folder: pathlib.Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = start_run(folder, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for(path: pathlib.Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Wait until `path` exists while `proc` runs (fails with its output if it ends first)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended before {path.name}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str, float]:
    """Wait (bounded) for a run; returns its exit code, output and the seconds it took. A run
    still going after `timeout` is killed (with every process of its group) and fails."""
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s (hang):\n{out}\n{err}") from None
    return proc.returncode, out, err, time.monotonic() - start


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def run_in_terminal(
    folder: pathlib.Path, keys: bytes, cue: str, timeout: float = 120
) -> tuple[int, str]:
    """`lightning-bridge run const.yaml` with a pseudo-terminal as its controlling terminal
    (a user's shell); once `cue` exists in the folder, `keys` are typed (b"\x03": Ctrl-C).
    Returns the exit code and everything the terminal showed."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [sys.executable, "-m", "lightning_bridge", "run", "const.yaml"],
        cwd=folder,
        env=cli_env(folder),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=controlling_terminal,
    )
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    typed = False
    try:
        while time.monotonic() < deadline:
            if not typed and (folder / cue).exists():
                os.write(master, keys)
                typed = True
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal's last user is gone
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        else:
            raise AssertionError(f"still running after {timeout} s:\n{shown.decode()}")
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.wait(), shown.decode(errors="replace")


def group_alive(proc: subprocess.Popen[str]) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_group_gone(proc: subprocess.Popen[str], timeout: float = 30) -> bool:
    """Whether every process of the run's group has ended within `timeout` (no orphan)."""
    deadline = time.monotonic() + timeout
    while group_alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) is not running
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def events(folder: pathlib.Path) -> list[dict[str, Any]]:
    file = folder / "events.jsonl"
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines()]


def checkpoints(folder: pathlib.Path, experiment_id: int | None = None) -> list[pathlib.Path]:
    """The checkpoints the record keeps of an experiment of the folder's runs (default: the
    newest), oldest first."""
    from tests._cli_folders import kept_checkpoints

    return sorted(kept_checkpoints(experiment_id, workspace(folder)), key=steps)


def in_directory(base: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints in a checkpoint directory, oldest first."""
    found = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(found, key=steps)


def steps(checkpoint: pathlib.Path) -> int:
    return int(json.loads((checkpoint / "metadata.json").read_text())["steps_completed"])


def weights(checkpoint: pathlib.Path) -> list[torch.Tensor]:
    state = torch.load(checkpoint / "state_dict.pth", weights_only=False)
    return list(state["models_state_dict"][0].values())


def same_weights(a: pathlib.Path, b: pathlib.Path) -> bool:
    return all(torch.equal(x, y) for x, y in zip(weights(a), weights(b), strict=True))
