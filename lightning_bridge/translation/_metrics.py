"""Training and validation metric handling: checks, conversion, averaging and reduction.

Training metrics are kept per batch for a reporting window and averaged when it closes, as
Determined averages them: any value is accepted (strings, None, arrays); a metric's average
is the mean of its non-None values, or None where they cannot be averaged. Validation metrics
of `evaluate_batch` are reduced per metric with the trial's `Reducer`s by torchmetrics
aggregators, which also combine them across processes; a non-scalar value (a list of tensors,
an array of any shape) reduces over all of its elements. `evaluate_full_dataset` results pass
through unchanged, except that tensors become numpy values. `ValidationPass` collects one
validation's outputs: `evaluate_batch` metrics checked (the same names every batch) and
reduced at the end, or the chief's `evaluate_full_dataset` metrics, shared with every process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torchmetrics.aggregation import BaseAggregator, MaxMetric, MeanMetric, MinMetric, SumMetric

from lightning_bridge._errors import InvalidTrialError, TrialRuntimeError, TrialTypeError
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._reducer import Reducer, reducers_for_keys
from lightning_bridge.translation._values import scalar_items, searcher_value

__all__ = ["scalar_items", "searcher_value"]


def _check_names(where: str, out: Mapping[Any, Any]) -> None:
    for key in out:
        if not isinstance(key, str):
            raise InvalidTrialError(
                f"{where} returned a metric name {key!r}; names must be strings."
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
    _check_names("train_batch()", out)
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def check_validation_output(out: Any, where: str) -> dict[str, Any]:
    if not isinstance(out, Mapping):
        raise TrialTypeError(
            f"{where} must return a dict of metric names to values; got {type(out).__name__}."
        )
    _check_names(where, out)
    return dict(out)


def to_numpy(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tensors become numpy values (on the host); everything else is kept as is."""
    return {
        k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
        for k, v in metrics.items()
    }


def _average(values: list[Any]) -> Any:
    """Determined's average of one training metric over a window's batches.

    The mean over the non-None values (all elements of same-shaped arrays); NaN when every
    value is None; None when the values cannot be averaged (strings, arrays of different
    shapes).
    """
    try:
        array = np.array(values)
        present = array[array != None]  # noqa: E711 (element-wise comparison)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.mean(present).item()
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
    return {key: _average([m[key] for m in batch_metrics]) for key in keys}


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
            try:
                batch[key] = np.mean(np.asarray(values), axis=0) if values else None
            except (TypeError, ValueError):
                # Strings and other values that cannot be averaged: the chief's value.
                batch[key] = per_process[0][key]
        averaged.append(batch)
    return averaged


_AGGREGATORS: dict[Reducer, Callable[..., BaseAggregator]] = {
    Reducer.AVG: MeanMetric,
    Reducer.SUM: SumMetric,
    Reducer.MAX: MaxMetric,
    Reducer.MIN: MinMetric,
}


def _aggregate(reducer: Reducer, values: np.ndarray, device: torch.device) -> Any:
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
            if values.dtype.kind not in "biuf":
                values = values.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidTrialError(
                f"evaluate_batch() returned metric {key!r} with different shapes on different "
                f"batches or with values that are not numbers ({exc}); return numbers, tensors "
                "or arrays of the same shape on every batch."
            ) from None
        out[key] = _aggregate(reducers[key], values, device)
    return out


class ValidationPass:
    """The outputs of one validation, from its first batch to its reduced metrics."""

    def __init__(self) -> None:
        self._outputs: list[dict[str, Any]] = []
        self._keys: set[str] | None = None
        self._full: dict[str, Any] = {}

    def add_batch(self, out: Any, batch_idx: int) -> None:
        """One `evaluate_batch` result; every batch must return the same metric names."""
        metrics = check_validation_output(out, "evaluate_batch()")
        if self._keys is None:
            self._keys = set(metrics)
        elif set(metrics) != self._keys:
            raise InvalidTrialError(
                "evaluate_batch() must return the same metric names for every batch: batch "
                f"{batch_idx} returned {sorted(metrics)}, earlier batches "
                f"{sorted(self._keys)}."
            )
        self._outputs.append(to_numpy(metrics))

    def set_full(self, out: Any) -> None:
        """The `evaluate_full_dataset` result (the chief's)."""
        self._full = to_numpy(check_validation_output(out, "evaluate_full_dataset()"))

    def batch_outputs(self) -> list[dict[str, Any]]:
        """Every batch's metrics, as `on_validation_epoch_end` receives them."""
        if not self._outputs:
            raise TrialRuntimeError(
                "The validation data loader yielded no batches: give "
                "build_validation_data_loader() a non-empty dataset."
            )
        return self._outputs

    def reduce_batches(self, reducer: Any, device: torch.device) -> dict[str, Any]:
        """The batches' metrics reduced per name (and across processes)."""
        outputs = self.batch_outputs()
        keys = list(outputs[0])
        return reduce_validation_metrics(outputs, keys, reducers_for_keys(reducer, keys), device)

    def full_metrics(self, distributed: DistributedContext) -> dict[str, Any]:
        """The chief's full-dataset metrics, on every process."""
        metrics = dict(self._full)
        if distributed.size > 1:
            metrics = distributed.broadcast(metrics)
        return metrics
