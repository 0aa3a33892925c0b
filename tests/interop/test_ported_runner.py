"""`lightning-bridge run` on ported Lightning projects with the real `determined` installed.

With Determined importable, a ported `model_def.py` builds its trial on Determined's
`PyTorchTrial`, so the adapter hands the bridge Determined's `LRScheduler.StepMode` members.
The runner must train such folders: the checked-in `examples/ported` folder (test mode), and
a freshly ported module with `ReduceLROnPlateau`, whose weights must be lightning.Trainer's.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from lightning_bridge.port._write import write_trial_folder
from tests._folders import checkpoint_weights, kept_checkpoints, steps_completed

pytestmark = pytest.mark.interop
pytest.importorskip("determined.pytorch")

ROOT = pathlib.Path(__file__).resolve().parents[2]

PROJECT = """
import lightning.pytorch as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.3 * torch.randn(n, 1, generator=g))


class PlateauRegressor(pl.LightningModule):
    def __init__(self, lr: float = 0.1, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)
        with torch.no_grad():
            self.layer.weight.fill_(0.1)
            self.layer.bias.zero_()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, threshold=0.5)
        return {"optimizer": opt, "lr_scheduler": plateau, "monitor": "val_loss"}

    def train_dataloader(self):
        return DataLoader(data(32, 1), batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(data(16, 2), batch_size=8)
"""


def _run(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_DATA_HOME": str(folder.parent / "xdg")}
    return subprocess.run(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_checked_in_ported_example_runs_with_determined_installed(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ported"
    shutil.copytree(ROOT / "examples" / "ported", folder)
    result = _run(folder, "run", "const.yaml", "--test")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "val_accuracy" in result.stdout


def test_ported_plateau_module_trains_like_lightning(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "plateau_project.py").write_text(textwrap.dedent(PROJECT))
    out = tmp_path / "trial"
    monkeypatch.chdir(project)
    write_trial_folder("plateau_project:PlateauRegressor", out)
    config = yaml.safe_load((out / "const.yaml").read_text())
    config["searcher"]["max_length"] = {"epochs": 3}
    (out / "const.yaml").write_text(yaml.safe_dump(config))

    result = _run(out, "run", "const.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoints = sorted(
        kept_checkpoints(workspace=tmp_path / "xdg" / "lightning-bridge"), key=steps_completed
    )
    got = checkpoint_weights(checkpoints[-1])

    sys.path.insert(0, str(project))
    try:
        import lightning.pytorch as pl
        from plateau_project import PlateauRegressor  # type: ignore[import-not-found]

        expected = PlateauRegressor()  # the same module port imported
        trainer = pl.Trainer(
            max_epochs=3,
            num_sanity_val_steps=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
        )
        trainer.fit(expected)
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("plateau_project", None)
    assert trainer.optimizers[0].param_groups[0]["lr"] < 0.1, "the plateau scheduler stepped"
    assert steps_completed(checkpoints[-1]) == 12
    for key, value in expected.state_dict().items():
        assert torch.equal(got[key], value), key
