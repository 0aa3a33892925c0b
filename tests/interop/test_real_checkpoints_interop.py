"""Checkpoints written by released Determined versions, on the reference and on the bridge.

The fixtures (tests/fixtures/determined_checkpoints) were written by Determined 0.17.15 -
0.38.1 under numpy 1. determined==0.38.1 loads, continues and warm-starts each in its own
process (with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, which it needs to read them on this torch);
the bridge does the same here, weights-only, and both must agree: the loaded weights exactly,
and the metrics, batch indices and final weights of every continued or warm-started run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from lightning_bridge.contract import _import_map
from lightning_bridge.contract._code_import import import_trial_class

from . import real_ckpt_cases

pytestmark = pytest.mark.interop
pytest.importorskip("determined.pytorch")

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "determined_checkpoints"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if (p / "state_dict.pth").is_file())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("reference") / "out.json"
    # Determined imports each checkpoint's code/ where it lies: no bytecode is written into the
    # fixtures, which another session's tests read at the same time.
    env = {
        **os.environ,
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    subprocess.run(
        [sys.executable, "-m", "tests.interop.real_ckpt_cases", str(out), str(FIXTURES), *VERSIONS],
        check=True,
        env=env,
        cwd=tmp_path_factory.mktemp("cwd"),
        timeout=600,
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def bridge() -> dict[str, Any]:
    import lightning_bridge

    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    _import_map.install(force=True)  # the unchanged trial code imports `determined`
    try:
        classes = {
            v: import_trial_class("model_def:TinyTrial", FIXTURES / v / "code") for v in VERSIONS
        }
        return real_ckpt_cases.run_cases(lightning_bridge, FIXTURES, VERSIONS, classes)
    finally:
        _import_map.uninstall()


def _close(got: Any, expected: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            _close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _close(g, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert np.isclose(got, expected, rtol=1e-6, atol=1e-7), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


@pytest.mark.parametrize("version", VERSIONS)
def test_loads_the_weights_the_reference_loads(
    version: str, reference: dict[str, Any], bridge: dict[str, Any]
) -> None:
    assert bridge[version]["load"] == reference[version]["load"]


@pytest.mark.parametrize("version", VERSIONS)
def test_continues_and_warm_starts_like_the_reference(
    version: str, reference: dict[str, Any], bridge: dict[str, Any]
) -> None:
    ref, got = reference[version], bridge[version]
    assert sorted(got) == sorted(ref)
    if "warm" not in ref:
        return  # pre-0.21 local test mode wrote no trial state to continue
    # A new run from another trial's checkpoint trains from batch 0 on both.
    assert got["warm"]["batch_idx"] == ref["warm"]["batch_idx"] == [0, 1, 2, 3]
    _close(got["warm"], ref["warm"], f"{version}.warm")
    # Continuing: the reference's local mode (no master to say how far the trial got) numbers
    # the batches after a resume from 0; the bridge numbers them as a cluster trial does.
    # TinyTrial does not read the index, so metrics and weights must agree all the same.
    assert ref["continue"].pop("batch_idx") == [0, 1, 2, 3]
    assert got["continue"].pop("batch_idx") == [4, 5, 6, 7]
    _close(got["continue"], ref["continue"], f"{version}.continue")
    assert [m["batches"] for m in got["continue"]["train"]] == [6, 8]
