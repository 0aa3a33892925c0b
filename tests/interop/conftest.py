"""Fixtures of the tests that run Determined's local mode beside the bridge."""

from __future__ import annotations

import pathlib

import pytest


@pytest.fixture
def reference_workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A working directory beside, not around, the user data directory (`tmp_path/xdg`, set by
    the top-level conftest): Determined's local mode writes checkpoints under the user data
    directory and copies the working directory into each of them."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work
