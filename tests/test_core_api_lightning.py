"""Lightning users' Core API code: `core_v2` recording an unmanaged experiment from a plain
script, Determined's `DetLogger` in a `lightning.Trainer`, and a Lightning `Callback` that
reports, uploads checkpoints and asks `should_preempt()` under `lightning-bridge run`."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from lightning_bridge.contract import _import_map
from tests._folders import REPO, cli_env, command

pytestmark = pytest.mark.processes

# A LightningModule on made-up data: the loss it logs each step, a validation each epoch.
_MODULE = """
import torch
import lightning as L


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def trainer(**kwargs):
    return L.Trainer(
        accelerator="cpu", devices=1, max_epochs=2, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        **kwargs,
    )
"""

_CORE_V2 = """
from determined.experimental import core_v2

core_v2.init(config=core_v2.Config(
    name="unmanaged-run", hparams={"lr": 0.05},
    searcher={"name": "single", "metric": "val_loss"},
))
for step in (1, 2, 3):
    core_v2.train.report_training_metrics(steps_completed=step, metrics={"loss": 1.0 / step})
core_v2.train.report_validation_metrics(steps_completed=3, metrics={"val_loss": 0.25})
with core_v2.checkpoint.store_path({"steps_completed": 3}) as (path, storage_id):
    (path / "weights.txt").write_text("w")
print("INFO", core_v2.info.trial.trial_id, core_v2.url_reverse_webui_exp_view())
core_v2.close()
"""

_DET_LOGGER = (
    _MODULE
    + """
from determined.experimental import core_v2
from determined.lightning.experimental import DetLogger

logger = DetLogger(config=core_v2.Config(name="with-det-logger"))
trainer(logger=logger).fit(Tiny(), loader(), loader())
"""
)

# Under `lightning-bridge run`: a Callback reports each validation, uploads a checkpoint of
# the module's weights after it, and stops the Trainer when should_preempt() says so.
_CALLBACK_SCRIPT = (
    _MODULE
    + """
import pathlib, tempfile
import determined as det


class CoreReports(L.Callback):
    def __init__(self, core_context):
        self.core = core_context

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking:
            return
        steps = trainer.global_step
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.core.train.report_validation_metrics(steps_completed=steps, metrics=metrics)
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(module.state_dict(), pathlib.Path(tmp) / "model.pt")
            self.core.checkpoint.upload(tmp, {"steps_completed": steps})
        if self.core.preempt.should_preempt():
            trainer.should_stop = True


with det.core.init() as core_context:
    trainer(callbacks=[CoreReports(core_context)], logger=False).fit(Tiny(), loader(), loader())
"""
)


def _env(work: pathlib.Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "LIGHTNING_BRIDGE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(_import_map.shim_dir(work)), str(REPO)])
    env["LIGHTNING_BRIDGE_WORKSPACE"] = str(work / "ws")
    env["XDG_DATA_HOME"] = str(work / "xdg")
    return env


def _script(work: pathlib.Path, text: str) -> subprocess.CompletedProcess[str]:
    (work / "script.py").write_text(text)
    done = subprocess.run(
        [sys.executable, "script.py"],
        cwd=work,
        env=_env(work),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _describe(work: pathlib.Path, experiment: int = 1) -> dict[str, Any]:
    done = subprocess.run(
        command("experiment", "describe", str(experiment), "--json"),
        cwd=work,
        env=_env(work),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_core_v2_records_an_unmanaged_experiment(tmp_path: pathlib.Path) -> None:
    done = _script(tmp_path, _CORE_V2)
    assert "INFO 1 lightning-bridge experiment describe 1" in done.stdout
    data = _describe(tmp_path)
    assert data["name"] == "unmanaged-run"
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED" and trial["hparams"] == {"lr": 0.05}
    assert [(m["batches"], m["values"]) for m in trial["training"]] == [
        (1, {"loss": 1.0}),
        (2, {"loss": 0.5}),
        (3, {"loss": 1 / 3}),
    ]
    assert [m["values"] for m in trial["validation"]] == [{"val_loss": 0.25}]
    (kept,) = data["checkpoints"]
    assert (pathlib.Path(kept["location"]) / "weights.txt").read_text() == "w"
    listed = subprocess.run(
        command("experiment", "list"),
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "unmanaged-run" in listed.stdout, listed.stdout + listed.stderr


def test_det_logger_reports_a_lightning_trainer(tmp_path: pathlib.Path) -> None:
    _script(tmp_path, _DET_LOGGER)
    data = _describe(tmp_path)
    assert data["name"] == "with-det-logger"
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED"
    # Lightning logs the loss at each of the 8 steps (4 batches, 2 epochs), val_loss per epoch.
    losses = [m for m in trial["training"] if "loss" in m["values"]]
    assert [m["batches"] for m in losses] == list(range(8))
    assert any("val_loss" in m["values"] for m in trial["training"])


def test_a_lightning_callback_reports_and_uploads_under_the_command(
    tmp_path: pathlib.Path,
) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "train.py").write_text(_CALLBACK_SCRIPT)
    (folder / "const.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "lightning-callback",
                "entrypoint": "python3 train.py",
                "searcher": {"name": "single", "metric": "val_loss"},
                "checkpoint_storage": {"save_trial_latest": 2},
                "max_restarts": 0,
            }
        )
    )
    ws = tmp_path / "ws"
    done = subprocess.run(
        command("run", "const.yaml", "--workspace", str(ws)),
        cwd=folder,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shown = subprocess.run(
        command("experiment", "describe", "1", "--json", "--workspace", str(ws)),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    data = json.loads(shown.stdout)
    (trial,) = data["trials"]
    assert trial["state"] == "COMPLETED"
    assert [m["batches"] for m in trial["validation"]] == [4, 8]
    assert all(set(m["values"]) == {"loss", "val_loss"} for m in trial["validation"])
    # Both checkpoints kept (save_trial_latest: 2), each with the module's weights.
    assert [c["batches"] for c in data["checkpoints"]] == [4, 8]
    for c in data["checkpoints"]:
        assert sorted(p.name for p in pathlib.Path(c["location"]).iterdir()) == [
            "metadata.json",
            "model.pt",
        ]
