"""`lightning-bridge run` with determined==0.38.1 installed: the trial's `from determined import
pytorch` is Determined's own module (its PyTorchTrial, DataLoader, callbacks, Reducer), the
bridge trains it, and the result matches Determined's local Trainer on the same trial."""

from __future__ import annotations

import copy
import importlib
import json
import os
import pathlib
import sys

import pytest
import torch

from lightning_bridge.experiment.cli._main import main
from tests._folders import (  # isolated_imports: an autouse fixture
    BASE_CONFIG,
    checkpoint_weights,
    isolated_imports,  # noqa: F401
    kept_checkpoints,
    steps_completed,
    write_folder,
)

pytestmark = pytest.mark.interop


def _losses(folder: pathlib.Path) -> list[float]:
    lines = (folder / "events.jsonl").read_text().splitlines()
    return [json.loads(line)["val"] for line in lines]


def test_model_def_with_determined_installed_matches_determined(tmp_path: pathlib.Path) -> None:
    det_pytorch = pytest.importorskip("determined.pytorch")
    config = write_folder(tmp_path, name="bridge")
    assert main(["run", str(config)]) == 0
    trial_module = sys.modules["model_def"]
    assert trial_module.pytorch is det_pytorch  # Determined's module, not the mapping
    bridge = config.parent
    kept = sorted(kept_checkpoints(), key=steps_completed)
    assert steps_completed(kept[-1]) == 16

    # The same folder trained by Determined's local Trainer with the config's values.
    reference = tmp_path / "reference"
    write_folder(tmp_path, name="reference")
    sys.modules.pop("model_def", None)
    sys.path.insert(0, str(reference))
    os.chdir(reference)
    model_def = importlib.import_module("model_def")
    with det_pytorch.init(
        hparams={"global_batch_size": 8, "lr": 0.05}, exp_conf=copy.deepcopy(BASE_CONFIG)
    ) as ctx:
        trial = model_def.LinearTrial(ctx)
        det_pytorch.Trainer(trial, ctx).fit(
            max_length=det_pytorch.Epoch(2),
            validation_period=det_pytorch.Batch(4),
            checkpoint_policy="none",
        )
    assert _losses(bridge) == pytest.approx(_losses(reference), rel=1e-5)
    for key, value in checkpoint_weights(kept[-1]).items():
        torch.testing.assert_close(value, trial.model.state_dict()[key], rtol=1e-6, atol=1e-7)
