"""The trial's own gradient scaler (wrap_scaler) behaves as on Determined, inf steps included."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import torch

reference = pytest.importorskip("determined.pytorch")
bridge = pytest.importorskip("lightning_bridge")

from tests._amp_trial import make_scaler_trial  # noqa: E402

pytestmark = pytest.mark.interop


def _run(api: Any, tmp_path: pathlib.Path, **init_kwargs: Any) -> Any:
    with api.init(hparams={"global_batch_size": 8}, **init_kwargs) as ctx:
        trial = make_scaler_trial(api)(ctx)
        api.Trainer(trial, ctx).fit(max_length=api.Batch(6), reporting_period=api.Batch(2))
    return trial


def test_scaler_path_matches_the_reference(
    tmp_path: pathlib.Path, reference_workdir: pathlib.Path
) -> None:
    ref = _run(reference, tmp_path, enable_tensorboard_logging=False)
    got = _run(
        bridge,
        tmp_path,
        enable_tensorboard_logging=False,
        trainer_kwargs={"enable_progress_bar": False, "enable_model_summary": False},
    )
    assert got.scales == ref.scales
    for a, b in zip(got.weights, ref.weights, strict=True):
        assert torch.equal(a, b)
