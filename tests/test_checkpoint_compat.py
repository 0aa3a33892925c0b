"""Checkpoints users actually hold: written by Determined 0.13 - 0.38, under numpy 1.

`tests/fixtures/determined_checkpoints/<version>/` were written by released Determined versions
(under numpy 1.26, see make_fixtures.py there): their `state_dict.pth` refers to numpy 1's
`numpy.core.multiarray`. Older layouts (no load_data.json, workload_sequencer.pkl, the
pre-0.14 API) are built here from those files the way the older versions laid them out.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import shutil
import sys
from typing import Any

import numpy as np
import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from tests._folders import isolated_imports  # noqa: F401  (autouse)
from tests._trials import LinearTrial, fit

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "determined_checkpoints"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if (p / "state_dict.pth").is_file())


def _copy(version: str, dest: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(FIXTURES / version, dest / version))


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_fixtures_hold_numpy_1_names() -> None:
    assert VERSIONS == [
        "0.17.15",
        "0.20.1",
        "0.21.2",
        "0.23.4",
        "0.26.7",
        "0.29.1",
        "0.32.1",
        "0.35.1",
        "0.38.1",
    ]
    for version in VERSIONS:
        data = (FIXTURES / version / "state_dict.pth").read_bytes()
        assert b"numpy.core.multiarray" in data and b"numpy._core" not in data, version


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_loads_weights_only_with_no_class_argument(version: str) -> None:
    before = list(sys.path)
    trial = pytorch.load_trial_from_checkpoint_path(FIXTURES / version)
    assert type(trial).__name__ == "TinyTrial"
    saved = torch.load(FIXTURES / version / "state_dict.pth", weights_only=False)
    for key, value in saved["models_state_dict"][0].items():
        assert torch.equal(trial.model.state_dict()[key], value)
    # Imported from the checkpoint's code/, which is not left behind.
    assert sys.path == before and "model_def" not in sys.modules
    assert not list((FIXTURES / version / "code").rglob("__pycache__"))


def _legacy_numpy_file(path: pathlib.Path) -> None:
    """A state_dict.pth pickled with numpy 1's module path, as numpy 1 writes it."""
    payload = {
        "models_state_dict": [torch.nn.Linear(3, 1).state_dict()],
        "rng_state": {"np_rng_state": np.random.get_state(), "scalar": np.float64(0.5)},
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer, _use_new_zipfile_serialization=False)
    data = buffer.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    assert data.count(b"numpy.core.multiarray\n") >= 2  # _reconstruct and scalar
    path.write_bytes(data)


def test_numpy_1_names_written_here_load_and_restore(tmp_path: pathlib.Path) -> None:
    np.random.seed(3)
    _legacy_numpy_file(tmp_path / "state_dict.pth")
    expected = np.random.random(4)
    payload, _ = read_checkpoint(tmp_path)
    np.random.set_state(payload["rng_state"]["np_rng_state"])
    assert np.array_equal(np.random.random(4), expected)
    assert payload["rng_state"]["scalar"] == np.float64(0.5)


class Unsafe:
    """A custom object: outside the weights-only safe set."""


def _with_custom_object(version: str, tmp_path: pathlib.Path) -> pathlib.Path:
    ckpt = _copy(version, tmp_path)
    payload = torch.load(ckpt / "state_dict.pth", weights_only=False)
    payload["callbacks"] = {"note": Unsafe()}
    torch.save(payload, ckpt / "state_dict.pth")
    return ckpt


def test_trust_opt_in_for_load_trial(tmp_path: pathlib.Path, caplog: Any) -> None:
    ckpt = _with_custom_object("0.38.1", tmp_path)
    with pytest.raises(pytorch.InvalidCheckpointError, match="trust_checkpoint=True") as info:
        pytorch.load_trial_from_checkpoint_path(ckpt)
    assert "Unsafe" in str(info.value) and "load_trial_from_checkpoint_path" in str(info.value)
    trial = pytorch.load_trial_from_checkpoint_path(ckpt, trust_checkpoint=True)
    assert type(trial).__name__ == "TinyTrial"
    assert "only do this for trusted files" in caplog.text


def test_old_layouts_metadata_json_and_workload_sequencer(tmp_path: pathlib.Path) -> None:
    """0.17.6 and older: no load_data.json; the class is the config's entrypoint."""
    ckpt = _copy("0.38.1", tmp_path)
    (ckpt / "load_data.json").unlink()
    (ckpt / "trial_state.pkl").unlink()
    config = {"entrypoint": "model_def:TinyTrial", "hyperparameters": {}}
    metadata = {"format": "pickle", "experiment_config": config, "hparams": {"lr": 1}}
    (ckpt / "metadata.json").write_text(json.dumps(metadata))
    sequencer = {"trial_id": 0, "last_ckpt": 4, "latest_batch": 4, "step_id": 4, "last_val": 4}
    (ckpt / "workload_sequencer.pkl").write_bytes(pickle.dumps(sequencer))
    trial = pytorch.load_trial_from_checkpoint_path(ckpt)
    assert trial.context.get_hparams() == {"lr": 1}
    _, state = read_checkpoint(ckpt)
    assert state is not None and (state.batches_trained, state.last_ckpt) == (4, 4)


def test_a_loaded_trial_aggregates_as_its_checkpoint_config_says(tmp_path: pathlib.Path) -> None:
    """A trial-class checkpoint's `optimizations.aggregation_frequency` is the loaded
    context's (as Determined builds it): stepping without zeroing gradients is refused."""
    ckpt = _copy("0.38.1", tmp_path)
    (ckpt / "load_data.json").unlink()
    config = {
        "entrypoint": "model_def:TinyTrial",
        "hyperparameters": {},
        "optimizations": {"aggregation_frequency": 2},
    }
    metadata = {"format": "pickle", "experiment_config": config, "hparams": {"lr": 1}}
    (ckpt / "metadata.json").write_text(json.dumps(metadata))
    trial = pytorch.load_trial_from_checkpoint_path(ckpt)
    (optimizer,) = trial.context.optimizers
    with pytest.raises(pytorch.InvalidTrialError, match="aggregation_frequency > 1"):
        trial.context.step_optimizer(optimizer, auto_zero_grads=False)


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


def test_pre_014_api_gives_the_bare_module(tmp_path: pathlib.Path) -> None:
    ckpt = tmp_path / "old"
    (ckpt / "code").mkdir(parents=True)
    (ckpt / "code" / "old_def.py").write_text(OLD_API)
    model = torch.nn.Linear(3, 1)
    torch.save({"model_state_dict": model.state_dict()}, ckpt / "state_dict.pth")
    config = {"entrypoint": "old_def:OldTrial"}
    (ckpt / "metadata.json").write_text(
        json.dumps({"format": "cloudpickle", "experiment_config": config, "hparams": {}})
    )
    loaded = pytorch.load_trial_from_checkpoint_path(ckpt)
    assert isinstance(loaded, torch.nn.Linear)
    assert torch.equal(loaded.weight, model.weight)


def test_cloudpickle_with_objects_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    torch.save({"model": torch.nn.Linear(3, 1)}, tmp_path / "checkpoint.pt")
    (tmp_path / "metadata.json").write_text(json.dumps({"format": "cloudpickle"}))
    with pytest.raises(pytorch.InvalidCheckpointError, match="pre-0.14 Determined 'cloudpickle'"):
        read_checkpoint(tmp_path)
    payload, _ = read_checkpoint(tmp_path, trusted=True)
    assert isinstance(payload["model"], torch.nn.Linear)


def test_main_module_class_names_the_fix(tmp_path: pathlib.Path) -> None:
    ckpt = _copy("0.38.1", tmp_path)
    data = json.loads((ckpt / "load_data.json").read_text())
    (ckpt / "load_data.json").write_text(json.dumps({**data, "trial_cls_spec": "__main__:T"}))
    with pytest.raises(pytorch.InvalidCheckpointError, match="trial_class=MyTrial"):
        pytorch.load_trial_from_checkpoint_path(ckpt)


# ----- continuing vs starting a new run (the bridge's own trial) -----


def _bridge_checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
    _, trainer = fit(LinearTrial, max_length=pytorch.Batch(6), checkpoint_period=pytorch.Batch(6))
    return pathlib.Path(trainer.checkpoints[-1])


def _set_trial_id(ckpt: pathlib.Path, trial_id: int) -> None:
    state = pickle.loads((ckpt / "trial_state.pkl").read_bytes())
    (ckpt / "trial_state.pkl").write_bytes(pickle.dumps({**state, "trial_id": trial_id}))


def test_another_trials_checkpoint_starts_a_new_run(tmp_path: pathlib.Path, caplog: Any) -> None:
    ckpt = _bridge_checkpoint(tmp_path)
    _set_trial_id(ckpt, 42)
    _, warm = fit(LinearTrial, max_length=pytorch.Batch(2), latest_checkpoint=str(ckpt))
    assert "written by trial 42" in caplog.text
    # A new run: two batches from batch 0, not a continuation past batch 6.
    state = pickle.loads((warm.checkpoints[-1] / "trial_state.pkl").read_bytes())
    assert state["batches_trained"] == 2 and state["trial_id"] == 0
    # warm_start=False continues the other trial's run instead.
    _, cont = fit(
        LinearTrial, max_length=pytorch.Batch(8), latest_checkpoint=str(ckpt), warm_start=False
    )
    state = pickle.loads((cont.checkpoints[-1] / "trial_state.pkl").read_bytes())
    assert (state["batches_trained"], state["trial_id"]) == (8, 42)


def test_warm_start_restores_the_weights(tmp_path: pathlib.Path) -> None:
    ckpt = _bridge_checkpoint(tmp_path)
    saved = torch.load(ckpt / "state_dict.pth", weights_only=True)
    seen: dict[str, Any] = {}

    class Probe(LinearTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            if "weights" not in seen:
                seen["weights"] = _weights(self.model)
                seen["batch_idx"] = batch_idx
            return super().train_batch(batch, epoch_idx, batch_idx)

    fit(Probe, max_length=pytorch.Batch(1), latest_checkpoint=str(ckpt), warm_start=True)
    assert seen["batch_idx"] == 0
    for key, value in saved["models_state_dict"][0].items():
        assert torch.equal(seen["weights"][key], value)
