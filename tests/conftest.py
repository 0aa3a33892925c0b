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
    yield tmp_path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slurm` start a Slurm cluster: they run only when `-m` names them (the
    slurm session), never as part of another selection."""
    if "slurm" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="needs the Slurm test cluster: run with -m slurm")
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(skip)
