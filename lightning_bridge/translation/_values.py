"""Reported metric values as single numbers: what loggers, a progress bar and the searcher
read. Kept apart from the reducers (`_metrics`, on torchmetrics) so that what only reports
values (a Core API script's contexts) does not load torchmetrics."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lightning_bridge._errors import TrialRuntimeError


def scalar_items(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are single numbers, as floats (for loggers and the progress bar)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, numbers.Number):
            out[key] = float(value)  # type: ignore[arg-type]
        elif isinstance(value, (np.ndarray, np.generic, torch.Tensor)) and np.size(value) == 1:
            out[key] = float(np.asarray(value).reshape(()))
    return out


def searcher_value(name: str, value: Any) -> float:
    """The searcher metric as a number to compare validations by (a scalar is required)."""
    if isinstance(value, (bool, np.bool_)) or np.size(value) != 1:
        raise TrialRuntimeError(
            f"The searcher metric {name!r} returned a non-scalar value: {value!r}; the "
            "searcher compares single numbers."
        )
    try:
        return float(np.asarray(value).reshape(()))
    except (TypeError, ValueError):
        raise TrialRuntimeError(
            f"The searcher metric {name!r} returned a non-numeric value: {value!r}."
        ) from None
