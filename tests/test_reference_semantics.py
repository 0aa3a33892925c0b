"""Determined's semantics the bridge follows: "overridden" methods, the built-in exception
types, the code/ copy in checkpoints, and the command line's checkpoint options."""

from __future__ import annotations

import logging
import pathlib
import pickle
import shutil
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.checkpoint._code import code_files, copy_code
from lightning_bridge.experiment.cli._main import main
from tests._folders import BASE_CONFIG, isolated_imports, write_folder  # noqa: F401
from tests._trials import LinearTrial, RegressionData, fit


class FullDataset(LinearTrial):
    # Restoring the base method switches the parent's evaluate_batch off.
    evaluate_batch = pytorch.PyTorchTrial.evaluate_batch

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {"validation_loss": torch.tensor(1.5), "per_class": [torch.tensor(1.0)]}


def test_restored_base_method_is_not_overridden() -> None:
    trial, trainer = fit(
        FullDataset, max_length=pytorch.Batch(2), validation_period=pytorch.Batch(2)
    )
    metrics = trainer.last_validation_metrics
    assert metrics["validation_loss"] == pytest.approx(1.5)
    assert metrics["per_class"][0].item() == 1.0  # passed through as returned
    assert (metrics["batches"], metrics["epochs"]) == (2, 0)


class EmptyValidation(LinearTrial):
    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(0), batch_size=4)


class NonDictValidation(LinearTrial):
    def evaluate_batch(self, batch: Any, batch_idx: int) -> Any:
        return torch.tensor(1.0)


@pytest.mark.parametrize(
    ("trial_cls", "builtin"), [(EmptyValidation, RuntimeError), (NonDictValidation, TypeError)]
)
def test_errors_are_the_builtins_determined_raises(trial_cls: type, builtin: type) -> None:
    with pytest.raises(builtin) as info:
        fit(trial_cls, max_length=pytorch.Batch(2), validation_period=pytorch.Batch(1))
    assert isinstance(info.value, pytorch.BridgeError)


def test_max_length_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Batch\\(int\\) or an Epoch\\(int\\)"):
        fit(LinearTrial, max_length=10)


def test_code_copy_honours_detignore_and_the_cap(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "exp"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "data").mkdir()
    (src / "model_def.py").write_text("x = 1\n")
    (src / "pkg" / "util.py").write_text("y = 2\n")
    (src / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (src / "data" / "big.bin").write_bytes(b"0" * 4096)
    (src / "notes.log").write_text("log\n")
    (src / ".detignore").write_text("data/\n*.log\n")
    (src / "checkpoints").mkdir()
    # A folder tagged as a cache (nox, pytest, mypy tag theirs) holds no code; a file of
    # that name without the specification's signature tags nothing.
    for name, tag in (("cache", "Signature: 8a477f597d28d172789f06886806bc55\n"), ("tool", "x")):
        (src / name).mkdir()
        (src / name / "CACHEDIR.TAG").write_text(tag)
        (src / name / "mod.py").write_text("z = 3\n")
    files = code_files(src, exclude=[src / "checkpoints"])
    assert [str(f) for f in files] == [
        "model_def.py", "pkg/util.py", "tool/CACHEDIR.TAG", "tool/mod.py"
    ]  # fmt: skip
    for name in ("cache", "tool"):
        shutil.rmtree(src / name)
    assert copy_code(src, tmp_path / "code")
    assert (tmp_path / "code" / "pkg" / "util.py").read_text() == "y = 2\n"
    (src / ".detignore").unlink()
    with caplog.at_level(logging.WARNING, logger="lightning_bridge"):
        assert not copy_code(src, tmp_path / "code2", max_bytes=1024)
    assert not (tmp_path / "code2").exists()
    assert "checkpoints carry no code/" in caplog.text and ".detignore" in caplog.text


def _latest_checkpoint() -> pathlib.Path:
    """The newest complete checkpoint of the default workspace (the test's XDG data dir)."""
    from lightning_bridge.record._registry import Registry

    with Registry() as registry:
        newest = max(registry.checkpoints(), key=lambda c: c.created_at)
    return pathlib.Path(newest.location)


def _unsafe_checkpoint() -> pathlib.Path:
    ckpt = _latest_checkpoint()
    payload = torch.load(ckpt / "state_dict.pth", weights_only=False)
    payload["callbacks"] = {"x": pathlib.PurePosixPath("custom")}
    torch.save(payload, ckpt / "state_dict.pth")
    return ckpt


def test_cli_trust_checkpoint_and_source_checkpoint(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    searcher = {**BASE_CONFIG["searcher"], "max_length": {"batches": 8}}
    config = write_folder(tmp_path, dict(BASE_CONFIG, searcher=searcher))
    assert main(["run", str(config)]) == 0
    ckpt = _unsafe_checkpoint()
    capsys.readouterr()
    longer = ["--set", "searcher.max_length.batches=12"]  # the first run is complete at 8
    assert main(["run", str(config), *longer, "--resume", ckpt.name]) != 0
    assert "--trust-checkpoint" in capsys.readouterr().err
    assert main(["run", str(config), *longer, "--resume", ckpt.name, "--trust-checkpoint"]) == 0

    # A new trial from that checkpoint (Determined's warm start): batch count from 0.
    source = pathlib.Path(shutil.copytree(ckpt, tmp_path / "source"))
    payload = torch.load(ckpt / "state_dict.pth", weights_only=False)
    torch.save({**payload, "callbacks": {}}, source / "state_dict.pth")
    warm = dict(BASE_CONFIG, searcher={**searcher, "max_length": {"batches": 2}})
    warm["searcher"]["source_checkpoint_uuid"] = str(source)
    config2 = write_folder(tmp_path, warm, name="exp2")
    assert main(["run", str(config2)]) == 0
    new = _latest_checkpoint()
    state = pickle.loads((new / "trial_state.pkl").read_bytes())
    assert state["batches_trained"] == 2
    assert (new / "code" / "model_def.py").is_file()
