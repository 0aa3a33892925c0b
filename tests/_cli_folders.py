"""Determined experiment folders (const.yaml + trial code) written for the CLI tests."""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import yaml

from lightning_bridge.contract import _import_map

# A trial written for Determined: it imports `determined.pytorch`, nothing of the bridge. It
# appends one line per validation to events.jsonl in the working directory. For the stop and
# upload tests: `STOP_AT_BATCH=N` in the environment sends the trial's own process SIGTERM
# while it trains batch N; hyperparameter `ballast: N` adds an N-float buffer to the model
# (a checkpoint that takes a while to upload).
MODEL_DEF = """
import json
import os
import signal

import torch
from determined import pytorch


class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


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

# A Trainer-API script as a Determined user writes it for a cluster: config from
# get_cluster_info(), the training length from fit(). It records what it saw in script.json.
TRAIN_PY = """
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


def write_folder(
    root: pathlib.Path, config: dict[str, Any] | None = None, name: str = "exp"
) -> pathlib.Path:
    """A trial folder (model_def.py, train.py, const.yaml) under `root`; returns const.yaml."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(textwrap.dedent(MODEL_DEF))
    (folder / "train.py").write_text(textwrap.dedent(TRAIN_PY))
    path = folder / "const.yaml"
    path.write_text(yaml.safe_dump(config if config is not None else BASE_CONFIG))
    return path


def validations(folder: pathlib.Path) -> list[float]:
    """The validation losses the trial logged, in order."""
    events = folder / "events.jsonl"
    if not events.exists():
        return []
    return [json.loads(line)["val"] for line in events.read_text().splitlines()]


def checkpoint_weights(checkpoint: pathlib.Path) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint / "state_dict.pth", weights_only=False)
    return dict(state["models_state_dict"][0])


def steps_completed(checkpoint: pathlib.Path) -> int:
    return int(json.loads((checkpoint / "metadata.json").read_text())["steps_completed"])


@pytest.fixture(autouse=True)
def isolated_imports() -> Iterator[None]:
    """Each run imports its folder's model_def through the determined mapping; undo both.

    Autouse in every test module that imports it."""
    path = list(sys.path)
    yield
    _import_map.uninstall()
    sys.path[:] = path
    sys.modules.pop("model_def", None)


def kept_checkpoints(
    experiment_id: int | None = None, workspace: pathlib.Path | None = None
) -> list[pathlib.Path]:
    """The checkpoint directories the record keeps for an experiment (default: the newest),
    oldest batch first; local storage only."""
    from lightning_bridge.experiment._checkpoints import storage_of
    from lightning_bridge.record._registry import Registry

    with Registry(workspace) as registry:
        if experiment_id is None:
            experiment_id = registry.experiments()[-1].id
        experiment = registry.experiment(experiment_id)
        found = []
        for checkpoint in registry.checkpoints(experiment_id=experiment_id):
            path = storage_of(registry, experiment, checkpoint.trial_id).local_path(checkpoint.uuid)
            assert path is not None and path.is_dir(), checkpoint
            found.append(path)
    return found
