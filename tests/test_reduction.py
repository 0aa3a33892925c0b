"""Built-in validation reducers: values a user sees for each `Reducer` choice."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.translation._metrics import reduce_validation_metrics

CPU = torch.device("cpu")


def _reduce(batches: list[dict], reducer: pytorch.Reducer) -> dict:
    keys = list(batches[0])
    return reduce_validation_metrics(batches, keys, dict.fromkeys(keys, reducer), CPU)


def test_avg_is_the_mean_over_every_element_of_every_batch() -> None:
    batches = [{"m": np.array([1.0, 2.0])}, {"m": np.array([3.0, 10.0])}]
    assert _reduce(batches, pytorch.Reducer.AVG)["m"] == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("reducer", "expected"),
    [(pytorch.Reducer.SUM, 12), (pytorch.Reducer.MAX, 7), (pytorch.Reducer.MIN, 1)],
)
def test_integer_metrics_stay_integers(reducer: pytorch.Reducer, expected: int) -> None:
    batches = [{"correct": 4}, {"correct": 7}, {"correct": 1}]
    value = _reduce(batches, reducer)["correct"]
    assert value == expected
    assert isinstance(value, np.integer)


def test_a_nan_batch_makes_the_reduced_metric_nan() -> None:
    batches = [{"loss": 0.5}, {"loss": float("nan")}, {"loss": 0.25}]
    for reducer in pytorch.Reducer:
        assert math.isnan(_reduce(batches, reducer)["loss"]), reducer


def test_float_precision_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=1000)
    batches = [{"x": v} for v in values]
    assert _reduce(batches, pytorch.Reducer.AVG)["x"] == pytest.approx(np.mean(values), rel=1e-12)
    assert _reduce(batches, pytorch.Reducer.SUM)["x"] == pytest.approx(np.sum(values), rel=1e-12)


def test_metric_whose_shape_changes_between_batches_is_refused() -> None:
    batches = [{"m": np.zeros(2)}, {"m": np.zeros(3)}]
    with pytest.raises(pytorch.InvalidTrialError, match="'m' with different shapes"):
        _reduce(batches, pytorch.Reducer.AVG)
