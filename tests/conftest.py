"""Shared fixtures: every test runs in its own working directory (logs, checkpoints)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    # No MLflow mirror unless a test asks for one (the mlflow tests name their server).
    monkeypatch.setenv("LIGHTNING_BRIDGE_MLFLOW", "off")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield tmp_path
