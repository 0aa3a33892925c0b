"""Load paths beside the reference: a `lightning-bridge run` checkpoint carrying its code/, a
checkpoint that needs full unpickling, Determined's pre-0.17.7 layout (no load_data.json,
workload_sequencer.pkl) and the pre-0.14 API (a trial with build_model()).

determined==0.38.1 loads each in its own process with no class argument; the bridge loads the
same directories here, and both give the same type and weights.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.experiment.cli._main import main
from tests._folders import BASE_CONFIG, kept_checkpoints, write_folder

pytestmark = pytest.mark.interop
pytest.importorskip("determined.pytorch")

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "determined_checkpoints" / "0.38.1"

OLD_API = """
import torch
from determined.pytorch import PyTorchTrial


class OldTrial(PyTorchTrial):
    def __init__(self, context):
        self.context = context

    def build_model(self):
        return torch.nn.Linear(3, 1)

    def optimizer(self, model):
        return torch.optim.SGD(model.parameters(), 0.1)

    def train_batch(self, batch, model, epoch_idx, batch_idx):
        return {"loss": model(batch).sum()}

    def build_training_data_loader(self):
        return None

    def build_validation_data_loader(self):
        return None
"""


def _run_checkpoint(root: pathlib.Path) -> pathlib.Path:
    """A checkpoint of `lightning-bridge run`, moved away from its (then deleted) folder."""
    searcher = {**BASE_CONFIG["searcher"], "max_length": {"batches": 4}}
    config = write_folder(root, dict(BASE_CONFIG, searcher=searcher))
    folder = config.parent
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"0" * 1000)
    (folder / ".detignore").write_text("data/\n")
    cwd = os.getcwd()
    try:
        assert main(["run", str(config)]) == 0
    finally:
        os.chdir(cwd)
    ckpt = kept_checkpoints()[-1]  # the run's last checkpoint, in the workspace
    moved = pathlib.Path(shutil.move(str(ckpt), root / "elsewhere"))
    shutil.rmtree(folder)
    for name in ("model_def", "train"):
        sys.modules.pop(name, None)
    return moved


def _trusted(root: pathlib.Path) -> pathlib.Path:
    ckpt = pathlib.Path(shutil.copytree(FIXTURE, root / "trusted"))
    payload = torch.load(ckpt / "state_dict.pth", weights_only=False)
    payload["callbacks"] = {"note": argparse.Namespace(kept=True)}
    torch.save(payload, ckpt / "state_dict.pth")
    return ckpt


def _pre_0177(root: pathlib.Path) -> pathlib.Path:
    ckpt = pathlib.Path(shutil.copytree(FIXTURE, root / "pre_0177"))
    (ckpt / "load_data.json").unlink()
    state = pickle.loads((ckpt / "trial_state.pkl").read_bytes())
    (ckpt / "trial_state.pkl").unlink()
    sequencer = {"trial_id": 3, "last_ckpt": 4, "latest_batch": 4, "step_id": 4, "last_val": 4}
    assert state["batches_trained"] == 4
    (ckpt / "workload_sequencer.pkl").write_bytes(pickle.dumps(sequencer))
    config = {"entrypoint": "model_def:TinyTrial", "hyperparameters": {"global_batch_size": 4}}
    metadata = {
        "determined_version": "0.17.6",
        "format": "pickle",
        "framework": "torch-1.9.0",
        "experiment_config": config,
        "hparams": {"global_batch_size": 4},
    }
    (ckpt / "metadata.json").write_text(json.dumps(metadata))
    return ckpt


def _pre_014(root: pathlib.Path) -> pathlib.Path:
    ckpt = root / "pre_014"
    (ckpt / "code").mkdir(parents=True)
    (ckpt / "code" / "old_def.py").write_text(OLD_API)
    torch.manual_seed(5)
    torch.save({"model_state_dict": torch.nn.Linear(3, 1).state_dict()}, ckpt / "state_dict.pth")
    config = {"entrypoint": "old_def:OldTrial", "hyperparameters": {}}
    metadata = {"format": "cloudpickle", "experiment_config": config, "hparams": {}}
    (ckpt / "metadata.json").write_text(json.dumps(metadata))
    return ckpt


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return {
            "run": _run_checkpoint(root),
            "trusted": _trusted(root),
            "pre_0177": _pre_0177(root),
            "pre_014": _pre_014(root),
        }
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def reference(
    checkpoints: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("reference") / "out.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    paths = [str(p) for p in checkpoints.values()]
    cmd = [sys.executable, "-m", "tests.interop.reference_load", str(out), *paths]
    subprocess.run(cmd, check=True, env=env, cwd=out.parent, timeout=300)
    loaded = json.loads(out.read_text())
    return {name: loaded[str(path)] for name, path in checkpoints.items()}


def _bridge(path: pathlib.Path, **kwargs: Any) -> dict[str, Any]:
    loaded = pytorch.load_trial_from_checkpoint_path(path, **kwargs)
    model = loaded if isinstance(loaded, torch.nn.Module) else loaded.context.models[0]
    return {
        "type": type(loaded).__name__,
        "weights": {k: v.tolist() for k, v in model.state_dict().items()},
    }


def test_run_checkpoint_carries_its_code(
    checkpoints: dict[str, pathlib.Path], reference: dict[str, Any]
) -> None:
    ckpt = checkpoints["run"]
    files = sorted(str(p.relative_to(ckpt / "code")) for p in (ckpt / "code").rglob("*"))
    assert {"const.yaml", "model_def.py", "train.py"} <= set(files)
    assert not [f for f in files if f.startswith(("data", "checkpoints", "tensorboard"))]
    metadata = json.loads((ckpt / "metadata.json").read_text())
    assert metadata["determined_version"] == "0.38.1" and "lightning_bridge_version" in metadata
    assert _bridge(ckpt) == reference["run"]
    assert reference["run"]["type"] == "LinearTrial"


def test_trusted_checkpoint(
    checkpoints: dict[str, pathlib.Path], reference: dict[str, Any]
) -> None:
    with pytest.raises(pytorch.InvalidCheckpointError, match="trust_checkpoint=True"):
        pytorch.load_trial_from_checkpoint_path(checkpoints["trusted"])
    assert _bridge(checkpoints["trusted"], trust_checkpoint=True) == reference["trusted"]


@pytest.mark.parametrize("layout", ["pre_0177", "pre_014"])
def test_older_layouts(
    layout: str, checkpoints: dict[str, pathlib.Path], reference: dict[str, Any]
) -> None:
    assert _bridge(checkpoints[layout]) == reference[layout]
    expected_type = "Linear" if layout == "pre_014" else "TinyTrial"
    assert reference[layout]["type"] == expected_type
