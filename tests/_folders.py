"""Determined experiment folders for the tests that run `lightning-bridge` as a user would: the
trials they train, the one function that writes a folder, the helpers that start the command on
it (subprocesses with time limits) and read back what it left (validations, checkpoints).

- `LINEAR` (`LinearTrial`, and as a Trainer-API `train.py`): the CLI, the record, scripts, S3.
- `FAULT` (`FaultTrial`, and its `train.py`): signals, kills, unusable checkpoint directories.
- `TINY` (`TinyTrial`): searches.

Each is written for Determined (`from determined import pytorch`, nothing of the bridge),
trains a linear model on the same generated regression data (`DATA`) and is driven by the
hyperparameters (for `LINEAR`, also the environment) listed above its source.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import io
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import yaml

from lightning_bridge.contract import _import_map

REPO = pathlib.Path(__file__).resolve().parents[1]

# The data every trial trains on: y = x @ w for 4 features, `n` records generated from `seed`.
DATA = """\
class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
"""


@dataclass(frozen=True)
class Trial:
    """A trial's source (`model_def.py`), its Trainer-API script (`train.py`, if any) and the
    experiment config a folder gets by default."""

    model_def: str
    config: dict[str, Any]
    train_py: str | None = None
    config_file: str = "const.yaml"
    sort_keys: bool = True  # as yaml.safe_dump writes it by default


# A trial for the CLI tests: appends one line per validation to events.jsonl in the working
# directory ({"val": loss}); records what its context saw in seen.json.
LINEAR_MODEL_DEF = (
    """
import json
import os
import signal

import torch
from determined import pytorch


"""
    + DATA
    + """

class Log(pytorch.PyTorchCallback):
    def __init__(self, context):
        self.context = context

    def on_validation_end(self, metrics):
        if self.context.distributed.rank == 0:
            with open("events.jsonl", "a") as f:
                f.write(json.dumps({"val": float(metrics["validation_loss"])}) + "\\n")


class LinearTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        torch.manual_seed(0)
        if context.get_hparams().get("fail") == "init":
            raise RuntimeError("deliberate failure in __init__")
        model = torch.nn.Linear(4, 1)
        if context.get_hparams().get("ballast"):
            model.register_buffer("ballast", torch.zeros(int(context.get_hparam("ballast"))))
        self.model = context.wrap_model(model)
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        )
        try:
            seed = context.get_trial_seed()
        except Exception:  # Determined's local mode has no trial seed
            seed = None
        d = context.distributed
        if hasattr(d, "get_local_size"):  # not the stand-in Determined loads checkpoints with
            seen = [d.get_rank(), d.get_size(), d.get_local_rank(), d.get_local_size()]
            seen += [d.get_cross_rank(), d.get_cross_size()]
            with open(f"init.{d.get_rank()}.json", "w") as f:
                json.dump(seen, f)  # what __init__ sees, per rank
        with open("seen.json", "w") as f:
            json.dump(
                {
                    "hparams": context.get_hparams(),
                    "data": context.get_data_config(),
                    "seed": seed,
                    "size": context.distributed.size,
                    "metric": context.get_experiment_config()["searcher"]["metric"],
                },
                f,
            )

    def build_callbacks(self):
        return {"log": Log(self.context)}

    def build_training_data_loader(self):
        return pytorch.DataLoader(
            Data(64, 0), batch_size=self.context.get_per_slot_batch_size()
        )

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(32, 1), batch_size=16)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if os.environ.get("STOP_AT_BATCH") == str(batch_idx):
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluation_reducer(self):
        return pytorch.Reducer.AVG

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""
)

# LinearTrial as a Trainer-API script as a Determined user writes it for a cluster: config
# from get_cluster_info(), the training length from fit(). It records what it saw in
# script.<rank>.json.
LINEAR_TRAIN_PY = """
import json
import os
import sys

import determined as det
from determined import pytorch
from model_def import LinearTrial

info = det.get_cluster_info()
assert info is not None, "not run by the runner"
if info.trial.hparams.get("fail") == "script":
    sys.exit(3)
with pytorch.init() as ctx:
    trainer = pytorch.Trainer(LinearTrial(ctx), ctx)
    trainer.fit(
        max_length=pytorch.Batch(6),
        validation_period=pytorch.Batch(3),
        latest_checkpoint=info.latest_checkpoint,
    )
with open(f"script.{ctx.distributed.rank}.json", "w") as f:
    json.dump(
        {
            "hparams": info.trial.hparams,
            "seed": info.trial.trial_seed,
            "user_data": info.trial.user_data,
            "latest_checkpoint": info.latest_checkpoint,
            "container_rank": info.container_rank,
            "size": ctx.distributed.size,
            "pytorch_module": pytorch.__name__,
            "trainer_class": type(trainer).__module__,
            "batches": json.load(
                open(os.path.join(trainer.checkpoints[-1], "metadata.json"))
            )["steps_completed"] if trainer.checkpoints else None,
        },
        f,
    )
"""

# The gate a test holds a trial at (hyperparameters `gate`, a folder, and `hold_at`, a batch
# index or a list of them; `Gate` below is the test's side): at batch `hold_at`, before
# training it, the process writes `reached.<pid>` into the folder and waits until the test
# creates `release` there, or until the process is signalled (SIGTERM / SIGINT / SIGUSR1,
# passed on to the handler it had: a pause, a requeue, a time limit's signal stop the trial
# as they would mid-batch). Waiting touches no random state: the weights are those of a run
# never held.
GATE_CODE = """
def hold_at_gate(hparams, batch_idx):
    import os, pathlib, signal, threading, time
    gate, hold = hparams.get("gate"), hparams.get("hold_at")
    if not gate or batch_idx not in (hold if isinstance(hold, list) else [hold]):
        return
    gate = pathlib.Path(gate)
    signalled = []
    previous = {}

    def on_signal(signum, frame):
        signalled.append(signum)
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            previous[signum] = signal.getsignal(signum)
            signal.signal(signum, on_signal)
    try:
        (gate / f"reached.{os.getpid()}").touch()
        deadline = time.monotonic() + 900
        while not signalled and not (gate / "release").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gate {gate} was not released within 900 s")
            time.sleep(0.02)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
"""


# The fault trial: `gate` / `hold_at` hold it at a batch (`GATE_CODE`: the test's gate),
# `sleep` slows every batch, `mark_at` writes `training.<rank>` once that many batches are
# trained (the test's cue to send the signal), `signal_at` makes rank 0 send SIGTERM to itself
# during that batch, `width` makes the model (and so every save) bigger, `hold_save_at` holds
# the save after that many batches half-written (`saving` appears) until the test creates
# `release`, `workers` gives the training data loader worker processes. Every process writes
# `pid.<rank>`; every validation appends {"batches": trained, "val": loss} to events.jsonl.
# Run as a plain script without Determined installed, it takes the bridge.
FAULT_MODEL_DEF = (
    """
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


"""
    + DATA
    + GATE_CODE
    + """

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
        hold_at_gate(self.hp, batch_idx)
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
)

# FaultTrial as a Trainer-API script: lengths from the config, like on a cluster.
FAULT_TRAIN_PY = """
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


# A trial for the search tests. `gate`, `hold_at`: the test's gate (`GATE_CODE`: a test holds
# a search's trials there to stop the search while they train); `mode`: "invalid" raises
# InvalidHP in __init__, "crash" RuntimeError. Each
# trial writes the seed it was given into its own folder (the folder of its run description).
TINY_MODEL_DEF = (
    """
import json
import os
import pathlib
import time

import torch
from determined import InvalidHP, pytorch


"""
    + DATA
    + GATE_CODE
    + """

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
        hold_at_gate(self.context.get_hparams(), batch_idx)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""
)

# The trial seed of a single trial with experiment seed 7 (derived as a search's first trial's
# is): pinned, so that a change of the derivation, which would change how every recorded run is
# repeated, fails the tests.
SEED_7 = 1710676876

BASE_CONFIG: dict[str, Any] = {
    "name": "linear",
    "entrypoint": "model_def:LinearTrial",
    "hyperparameters": {"global_batch_size": 8, "lr": {"type": "const", "val": 0.05}},
    "searcher": {
        "name": "single",
        "metric": "validation_loss",
        "max_length": {"epochs": 2},
    },
    "min_validation_period": {"batches": 4},
    "reproducibility": {"experiment_seed": 7},
    "data": {"url": "https://example.invalid/data"},
}
FAULT_CONFIG: dict[str, Any] = {
    "name": "faults",
    "entrypoint": "model_def:FaultTrial",
    "hyperparameters": {"global_batch_size": 8},
    "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 40}},
    "min_validation_period": {"batches": 4},
    "reproducibility": {"experiment_seed": 3},
}
SEARCH_CONFIG: dict[str, Any] = {
    "name": "tiny_search",
    "entrypoint": "model_def:TinyTrial",
    "hyperparameters": {
        "global_batch_size": 8,
        "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1},
    },
    "reproducibility": {"experiment_seed": 7},
    "scheduling_unit": 4,
    "max_restarts": 0,
}
# adaptive_asha, aggressive: one bracket of min(max_rungs 3, int(log 16 / log 2) + 1,
# int(log 4 / log 2) + 1) = 3 rungs at 16 / 2**2, 16 / 2, 16 batches; 2 trials at once.
ASHA_CONFIG: dict[str, Any] = {
    **SEARCH_CONFIG,
    "searcher": {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "max_trials": 4,
        "max_time": 16,
        "time_metric": "batches",
        "divisor": 2,
        "mode": "aggressive",
        "max_rungs": 3,
        "max_concurrent_trials": 2,
    },
}

LINEAR = Trial(LINEAR_MODEL_DEF, BASE_CONFIG, LINEAR_TRAIN_PY)
FAULT = Trial(FAULT_MODEL_DEF, FAULT_CONFIG, FAULT_TRAIN_PY)
TINY = Trial(TINY_MODEL_DEF, SEARCH_CONFIG, config_file="search.yaml", sort_keys=False)


def write_folder(
    root: pathlib.Path,
    config: dict[str, Any] | None = None,
    name: str = "exp",
    trial: Trial = LINEAR,
) -> pathlib.Path:
    """The folder `root/name` with the trial's code and `config` (default: the trial's own)
    as its config file (const.yaml; search.yaml for `TINY`); returns the config file."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(textwrap.dedent(trial.model_def))
    if trial.train_py is not None:
        (folder / "train.py").write_text(textwrap.dedent(trial.train_py))
    path = folder / trial.config_file
    config = config if config is not None else trial.config
    path.write_text(yaml.safe_dump(config, sort_keys=trial.sort_keys))
    return path


def fault_folder(root: pathlib.Path, name: str = "exp", **changes: Any) -> pathlib.Path:
    """A `FAULT` folder with `changes` to its config (`hyperparameters` are added to the
    global batch size); returns the folder."""
    config = copy.deepcopy(FAULT_CONFIG)
    config["hyperparameters"].update(changes.pop("hyperparameters", {}))
    config.update(changes)
    return write_folder(root, config, name, FAULT).parent


def workspace(folder: pathlib.Path) -> pathlib.Path:
    """The workspace (record, trial folders, checkpoints) of a folder's runs started by
    `start_run`: beside it, not inside it, where checkpoints would copy it with the code."""
    return folder.with_name(f"{folder.name}-ws")


@pytest.fixture(autouse=True)
def isolated_imports() -> Iterator[None]:
    """Each run imports its folder's model_def through the determined mapping; undo both.

    Autouse in every test module that imports it."""
    path = list(sys.path)
    yield
    _import_map.uninstall()
    sys.path[:] = path
    sys.modules.pop("model_def", None)


# ----- running lightning-bridge --------------------------------------------------------------


def command(*args: str) -> list[str]:
    """`lightning-bridge ARGS` with this interpreter."""
    return [sys.executable, "-m", "lightning_bridge", *args]


def console_script(*args: str) -> list[str]:
    """`lightning-bridge ARGS` through the installed console script, the entry point a user
    runs (`python -m lightning_bridge`, which exits the same way, where it is not installed)."""
    script = pathlib.Path(sys.executable).with_name("lightning-bridge")
    found = [str(script)] if script.is_file() else [sys.executable, "-m", "lightning_bridge"]
    return [*found, *args]


def cli_env(folder: pathlib.Path | None = None) -> dict[str, str]:
    """The environment of a command a test starts: this checkout's package, no launcher or
    bridge variables left over from the test process; with `folder`, the folder's own
    workspace."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LIGHTNING_BRIDGE_") or k == "LIGHTNING_BRIDGE_MLFLOW"
    }
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "NODE_RANK"):
        env.pop(var, None)
    env["PYTHONPATH"] = str(REPO)
    if folder is not None:
        env["LIGHTNING_BRIDGE_WORKSPACE"] = str(workspace(folder))
    return env


def run_args(folder: pathlib.Path, *args: str) -> list[str]:
    """`main()`'s arguments for `run const.yaml ARGS` of `folder` in its own workspace."""
    return ["run", str(folder / "const.yaml"), "--workspace", str(workspace(folder)), *args]


def run_in_process(
    cli: Callable[..., Any], argv: list[str], stop_at_batch: str | None = None
) -> str:
    """`cli(*argv)` (`main` with the test's options) in this process, its trial sent SIGTERM
    during batch `stop_at_batch` (`LINEAR`'s STOP_AT_BATCH); asserts exit code 0, returns
    what it printed."""
    out = io.StringIO()
    if stop_at_batch is not None:
        os.environ["STOP_AT_BATCH"] = stop_at_batch
    try:
        with contextlib.redirect_stdout(out):
            try:
                code = cli(*argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        os.environ.pop("STOP_AT_BATCH", None)
    assert code == 0, out.getvalue()
    return out.getvalue()


def start(args: list[str], cwd: pathlib.Path, log: pathlib.Path) -> subprocess.Popen[bytes]:
    """`lightning-bridge ARGS` in a session of its own (a test signals or kills all of it),
    its output in `log` as it is printed."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command(*args),
            cwd=cwd,
            env={**cli_env(), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish_logged(process: subprocess.Popen[bytes], log: pathlib.Path, timeout: float = 300) -> str:
    """Wait for a command `start` started (killing it and its trials past `timeout`); its
    output."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        process.wait(30)
        raise AssertionError(f"timed out:\n{log.read_text()[-4000:]}") from None
    return log.read_text()


def start_run(folder: pathlib.Path, *args: str) -> subprocess.Popen[str]:
    """`lightning-bridge run const.yaml ARGS` in `folder` with its own workspace, in its own
    session (a test signals its whole process group, as a terminal's Ctrl-C would), its
    output piped."""
    return subprocess.Popen(
        command("run", "const.yaml", *args),
        cwd=folder,
        env=cli_env(folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_cli(folder: pathlib.Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`start_run` to its end."""
    proc = start_run(folder, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str, float]:
    """Wait (bounded) for a piped process; returns its exit code, output and the seconds it
    took. One still going after `timeout` is killed (with every process of its group) and
    fails."""
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s (hang):\n{out}\n{err}") from None
    return proc.returncode, out, err, time.monotonic() - started


def wait_for(
    condition: Callable[[], Any] | pathlib.Path,
    process: subprocess.Popen[Any] | None = None,
    timeout: float = 120,
    what: str | None = None,
    log: pathlib.Path | None = None,
) -> Any:
    """Poll `condition` (or wait for a path to exist) until it holds, and return what it
    returned. Fails as soon as `process` ends (with its output: `log`, or its pipes), and at
    `timeout` (killing `process`'s group)."""
    if isinstance(condition, pathlib.Path):
        path = condition
        what = what or path.name
        condition = path.exists
    what = what or "the condition"

    def output() -> str:
        if log is not None:
            return log.read_text()[-4000:]
        if process is not None and process.stdout is not None and process.poll() is not None:
            out, err = process.communicate()
            return f"{out}\n{err}"
        return ""

    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the command ended before {what}:\n{output()}")
        if time.monotonic() > deadline:
            if process is not None:
                kill_group(process)
            raise AssertionError(f"{what}: not within {timeout} s\n{output()}")
        time.sleep(0.05)


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
        command("run", "const.yaml"),
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


def group_alive(proc: subprocess.Popen[Any]) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_group_gone(proc: subprocess.Popen[Any], timeout: float = 30) -> bool:
    """Whether every process of the run's group has ended within `timeout` (no orphan)."""
    deadline = time.monotonic() + timeout
    while group_alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent) is not running
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ----- what a run left ------------------------------------------------------------------------


def events(folder: pathlib.Path) -> list[dict[str, Any]]:
    """What the trial appended to events.jsonl, one dict a validation, in order."""
    file = folder / "events.jsonl"
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines()]


def validations(folder: pathlib.Path) -> list[float]:
    """The validation losses the trial logged, in order."""
    return [event["val"] for event in events(folder)]


def steps_completed(checkpoint: pathlib.Path) -> int:
    return int(json.loads((checkpoint / "metadata.json").read_text())["steps_completed"])


def checkpoint_weights(checkpoint: pathlib.Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint / "state_dict.pth", weights_only=False)
    return dict(state["models_state_dict"][0])


@dataclass(frozen=True)
class Gate:
    """The test's side of a trial's gate (`GATE_CODE`): a folder under the test's tmp dir,
    which every process of the test's trials sees, the search's trials on other nodes too."""

    path: pathlib.Path

    @classmethod
    def at(cls, path: pathlib.Path) -> Gate:
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    def hparams(self, batch: int | list[int]) -> dict[str, Any]:
        """The hyperparameters that hold each trial at `batch` (0-based: once `batch` batches
        are trained; a list: at each)."""
        return {"gate": str(self.path), "hold_at": batch}

    def options(self, batch: int | list[int]) -> tuple[str, ...]:
        """The same as `--set` options of `lightning-bridge run`."""
        return tuple(
            arg
            for k, v in self.hparams(batch).items()
            for arg in ("--set", f"hyperparameters.{k}={v}")
        )

    def reached(self) -> int:
        """How many processes have reached the gate so far."""
        return len(list(self.path.glob("reached.*")))

    def wait(self, count: int = 1, timeout: float = 240, seen: Callable[[], Any] = str) -> None:
        """Wait until `count` processes are held at the gate; on failure says what `seen()`
        returned (the record's trials, a log) at the end."""
        deadline = time.monotonic() + timeout
        while self.reached() < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.reached()} of {count} processes reached the gate {self.path} "
                    f"within {timeout:g} s; seen: {seen()}"
                )
            time.sleep(0.05)

    def release(self) -> None:
        """Let every process held (and every one that reaches the gate later) go on."""
        (self.path / "release").touch()


def weights_by_hparams(
    workspace: pathlib.Path, leave_out: tuple[str, ...] = ()
) -> dict[str, dict[str, torch.Tensor]]:
    """Each trial of experiment 1's final weights (its latest checkpoint), keyed by its
    hyperparameters less `leave_out` (a test's constants); every trial must have completed."""
    from lightning_bridge.record._registry import Registry

    out = {}
    with Registry(workspace) as registry:
        for trial in registry.trials(1):
            assert trial.state == "COMPLETED", trial
            latest = registry.latest_checkpoint(trial.id)
            assert latest is not None
            hparams = {k: v for k, v in trial.hparams.items() if k not in leave_out}
            out[json.dumps(hparams, sort_keys=True)] = checkpoint_weights(
                pathlib.Path(latest.location)
            )
    return out


def same_weights(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Whether two checkpoints hold the same model weights, bit for bit."""
    wa, wb = checkpoint_weights(a), checkpoint_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def kept_checkpoints(
    experiment_id: int | None = None, workspace: pathlib.Path | None = None
) -> list[pathlib.Path]:
    """The checkpoint directories the record keeps for an experiment (default: the newest),
    oldest batch first; local storage only."""
    from lightning_bridge.experiment.trials._checkpoints import trial_checkpoint_storage
    from lightning_bridge.record._registry import Registry

    with Registry(workspace) as registry:
        if experiment_id is None:
            experiment_id = registry.experiments()[-1].id
        experiment = registry.experiment(experiment_id)
        found = []
        for checkpoint in registry.checkpoints(experiment_id=experiment_id):
            path = trial_checkpoint_storage(registry, experiment, checkpoint.trial_id).local_path(
                checkpoint.uuid
            )
            assert path is not None and path.is_dir(), checkpoint
            found.append(path)
    return found


def checkpoints(folder: pathlib.Path, experiment_id: int | None = None) -> list[pathlib.Path]:
    """The checkpoints the record keeps of an experiment of a `start_run` folder's runs
    (default: the newest), oldest first."""
    return sorted(kept_checkpoints(experiment_id, workspace(folder)), key=steps_completed)


def in_directory(base: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints in a checkpoint directory, oldest first."""
    found = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(found, key=steps_completed)
