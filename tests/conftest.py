"""Shared fixtures: every test runs in its own working directory (logs, checkpoints); the
servers' fixtures (`postgres`) come from tests/_servers.py."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from tests._servers import _postgres_server, postgres  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def _workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    yield tmp_path
