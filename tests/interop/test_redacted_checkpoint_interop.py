"""A checkpoint of `lightning-bridge run` carries none of the config's secrets (the secret
environment variables' values are `***` in `load_data.json` and in the code copy's
const.yaml), and determined==0.38.1's `load_trial_from_checkpoint_path` still loads it, to the
weights the bridge loads."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest
import torch
import yaml

import lightning_bridge as pytorch
from lightning_bridge.experiment.cli._main import main
from tests._folders import (
    BASE_CONFIG,
    isolated_imports,  # noqa: F401  (autouse)
    kept_checkpoints,
    write_folder,
)

pytestmark = pytest.mark.interop
pytest.importorskip("determined.pytorch")

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_redacted_checkpoint_loads_in_determined(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, key, dsn = (f"s{uuid.uuid4().hex}" for _ in range(3))
    variables = [f"HF_TOKEN={token}", f"WANDB_API_KEY={key}", f"MY_DSN={dsn}", "PLAIN=kept"]
    monkeypatch.setenv("LIGHTNING_BRIDGE_SECRET_NAMES", "my_*")
    searcher = {**BASE_CONFIG["searcher"], "max_length": {"batches": 4}}
    config = dict(BASE_CONFIG, searcher=searcher, environment={"environment_variables": variables})
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(write_folder(tmp_path, config))]) == 0
    ckpt = kept_checkpoints()[-1]

    files = [p for p in ckpt.rglob("*") if p.is_file()]
    assert {"load_data.json", "code/const.yaml"} <= {p.relative_to(ckpt).as_posix() for p in files}
    held = [(p, s) for p in files for s in (token, key, dsn) if s.encode() in p.read_bytes()]
    assert not held, held
    shown = ["HF_TOKEN=***", "WANDB_API_KEY=***", "MY_DSN=***", "PLAIN=kept"]
    load_data = json.loads((ckpt / "load_data.json").read_text())
    assert load_data["experiment_config"]["environment"]["environment_variables"] == shown
    code_config = yaml.safe_load((ckpt / "code" / "const.yaml").read_text())
    assert code_config["environment"]["environment_variables"] == shown
    assert code_config["entrypoint"] == BASE_CONFIG["entrypoint"]
    for name in ("model_def", "train"):
        sys.modules.pop(name, None)

    out = tmp_path / "reference.json"
    cmd = [sys.executable, "-m", "tests.interop.reference_load", str(out), str(ckpt)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, timeout=300)
    reference = json.loads(out.read_text())[str(ckpt)]
    loaded = pytorch.load_trial_from_checkpoint_path(ckpt)
    weights = {k: v.tolist() for k, v in loaded.context.models[0].state_dict().items()}
    assert reference == {"type": "LinearTrial", "weights": weights}
    assert torch.tensor(weights["weight"]).abs().sum() > 0  # trained, not empty
