"""Training and validation metric handling: checks, conversion, averaging and reduction.

Training metrics are kept per batch for a reporting window and averaged when it closes.
Validation metrics are reduced per metric with the trial's `Reducer`s by torchmetrics
aggregators, which also combine them across processes.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torchmetrics.aggregation import BaseAggregator, MaxMetric, MeanMetric, MinMetric, SumMetric

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._reducer import Reducer


def _check_value(where: str, key: Any, value: Any) -> None:
    if not isinstance(key, str):
        raise InvalidTrialError(f"{where} returned a metric name {key!r}; names must be strings.")
    if value is None or isinstance(value, (numbers.Number, torch.Tensor, np.ndarray, np.generic)):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Number) for v in value):
        return
    raise InvalidTrialError(
        f"{where} returned metric {key!r} of type {type(value).__name__}; metric values must "
        "be numbers, tensors or numeric arrays."
    )


def check_training_output(out: Any) -> dict[str, Any]:
    """`train_batch`'s result as a metrics dict (a bare tensor becomes {"loss": tensor})."""
    if isinstance(out, torch.Tensor):
        return {"loss": out.detach()}
    if not isinstance(out, Mapping):
        raise InvalidTrialError(
            "train_batch() must return the loss tensor or a dict of metric names to values; "
            f"got {type(out).__name__}."
        )
    metrics = {}
    for key, value in out.items():
        _check_value("train_batch()", key, value)
        metrics[key] = value.detach() if isinstance(value, torch.Tensor) else value
    return metrics


def check_validation_output(out: Any, where: str) -> dict[str, Any]:
    if not isinstance(out, Mapping):
        raise InvalidTrialError(
            f"{where} must return a dict of metric names to values; got {type(out).__name__}."
        )
    for key, value in out.items():
        _check_value(where, key, value)
    return dict(out)


def to_numpy(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tensors become numpy values (on the host); everything else is kept as is."""
    return {
        k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
        for k, v in metrics.items()
    }


def _mean_or_none(values: list) -> float | None:
    present = [v for v in values if v is not None]
    try:
        return float(np.mean(np.asarray(present)).item()) if present else None
    except (TypeError, ValueError):
        return None


def average_training_metrics(batch_metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each metric over a window's batches (None for values that cannot be averaged)."""
    if not batch_metrics:
        return {}
    keys = list(batch_metrics[0])
    for i, metrics in enumerate(batch_metrics):
        if set(metrics) != set(keys):
            raise InvalidTrialError(
                "train_batch() must return the same metric names on every batch; batch "
                f"{i} of the window returned {sorted(metrics)} instead of {sorted(keys)}."
            )
    return {key: _mean_or_none([m[key] for m in batch_metrics]) for key in keys}


def average_across_processes(
    distributed: DistributedContext, batch_metrics: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per-batch training metrics averaged over processes (each trained its own shard)."""
    gathered = distributed.allgather(batch_metrics)
    averaged: list[dict[str, Any]] = []
    for per_process in zip(*gathered, strict=False):
        batch: dict[str, Any] = {}
        for key in per_process[0]:
            values = [m[key] for m in per_process if m.get(key) is not None]
            batch[key] = np.mean(np.asarray(values), axis=0) if values else None
        averaged.append(batch)
    return averaged


_AGGREGATORS: dict[Reducer, Callable[..., BaseAggregator]] = {
    Reducer.AVG: MeanMetric,
    Reducer.SUM: SumMetric,
    Reducer.MAX: MaxMetric,
    Reducer.MIN: MinMetric,
}


def _aggregate(reducer: Reducer, key: str, values: np.ndarray, device: torch.device) -> Any:
    """One metric's per-batch values reduced on this process and across processes.

    A torchmetrics aggregator does both: `compute()` syncs its state over the process group
    when there is one (every process must call it, in the same order). NaNs are kept, not
    dropped, so a diverged validation shows as NaN. Like Determined, a non-scalar metric
    reduces over all of its elements; a SUM / MAX / MIN of integers stays an integer.
    """
    # Moved first: `Metric.to()` resets the compute dtype set by `set_dtype()`.
    aggregator = _AGGREGATORS[reducer](nan_strategy="disable").to(device).set_dtype(torch.float64)
    if values.size:
        aggregator.update(torch.as_tensor(values.astype(np.float64), device=device))
    with warnings.catch_warnings():
        # A process that validated no batch still takes part in the sync.
        warnings.filterwarnings("ignore", message=".*compute.*before.*update.*")
        result = np.float64(aggregator.compute().item())
    if reducer is not Reducer.AVG and values.dtype.kind in "iub":
        return np.int64(result)
    return result


def reduce_validation_metrics(
    batch_metrics: list[dict[str, Any]],
    keys: Sequence[str],
    reducers: dict[str, Reducer],
    device: torch.device,
) -> dict[str, Any]:
    """Reduce per-batch validation metrics over this process's batches and every process's."""
    out: dict[str, Any] = {}
    for key in keys:
        try:
            values = np.stack([np.asarray(b[key]) for b in batch_metrics], axis=0)
        except ValueError as exc:
            raise InvalidTrialError(
                f"evaluate_batch() returned metric {key!r} with different shapes on different "
                f"batches ({exc}); return the same shape every batch."
            ) from None
        out[key] = _aggregate(reducers[key], key, values, device)
    return out


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
