"""Metrics Determined accepts beyond scalars, and its test of "overridden", on both APIs.

The same trials (`metric_trials`) train on determined==0.38.1 and on the bridge: every
`on_training_workload_end` (averages and raw per-batch values) and `on_validation_end` must be
equal, including what is added to the validation dict after the callbacks saw it (`batches`,
`epochs`).
"""

from __future__ import annotations

import pathlib
from types import ModuleType

import pytest

from .harness import isolated_environment
from .metric_trials import run

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
import lightning_bridge as bridge  # noqa: E402


@pytest.mark.parametrize("name", ["Base", "FullDataset"])
def test_metrics_match_the_reference(tmp_path: pathlib.Path, name: str) -> None:
    with isolated_environment(tmp_path / "reference"):
        expected = run(reference, name)
    with isolated_environment(tmp_path / "bridge"):
        got = run(bridge, name)
    assert got == expected
    # What the comparison covers: raw strings and None per batch, averages that are None
    # (strings) or NaN (only None), and batches / epochs added after the callbacks.
    assert expected["batch"][0][0]["note"] == "batch 0"
    assert expected["avg"][0]["note"] is None and expected["avg"][0]["never"] == "nan"
    assert "batches" not in expected["val"][0] and expected["val_after"][0]["batches"] == 2
    if name == "FullDataset":
        assert expected["val"][0]["nested"] == [[1, 2], [3]]
