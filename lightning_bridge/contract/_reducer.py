"""Metric reducers: the built-in `Reducer` choices and user `MetricReducer`s.

Validation metrics returned per batch are reduced with a `Reducer` (one for all metrics, or one
per metric). Custom metrics go through `MetricReducer`: each process reduces its own values
(`per_slot_reduce`), then the per-process results are combined (`cross_slot_reduce`).
"""

from __future__ import annotations

import abc
import enum
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.contract._determined_compat import as_bridge_enum, is_metric_reducer


class Reducer(enum.Enum):
    """How per-batch validation metrics are combined into one value."""

    AVG = 1
    SUM = 2
    MAX = 3
    MIN = 4


def reducers_for_keys(reducer: Any, keys: Sequence[str]) -> dict[str, Reducer]:
    """Expand `evaluation_reducer()`'s result to one `Reducer` per validation metric."""
    if isinstance(reducer, dict):
        if set(reducer) != set(keys):
            raise InvalidTrialError(
                "evaluation_reducer() returned a dict whose keys differ from the validation "
                f"metrics: metrics {sorted(keys)}, reducers {sorted(reducer)}. Return one "
                "Reducer for all metrics, or a dict with exactly one entry per metric."
            )
        chosen = dict(reducer)
    else:
        chosen = {key: reducer for key in keys}
    chosen = {key: as_bridge_enum(value, Reducer) for key, value in chosen.items()}
    for key, value in chosen.items():
        if not isinstance(value, Reducer):
            raise InvalidTrialError(
                f"evaluation_reducer() gave {value!r} for metric {key!r}; use a "
                "lightning_bridge.Reducer member such as Reducer.AVG."
            )
    return chosen


class MetricReducer(metaclass=abc.ABCMeta):
    """A custom metric computed correctly across processes.

    Update it yourself during `train_batch` / `evaluate_batch`; the bridge calls `reset` before
    each training window or validation, `per_slot_reduce` on every process after it, and
    `cross_slot_reduce` with the list of every process's per-slot result.
    """

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget accumulated values."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """This process's partial result (picklable)."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: list) -> Any:
        """The final metric (or a dict of metrics when wrapped without a name)."""


class _SimpleReducer(MetricReducer):
    """Adapts a plain function over the list of all updated values to `MetricReducer`."""

    def __init__(self, fn: Callable[[list], Any]) -> None:
        self.fn = fn
        self.values: list = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        self.values.append(value)

    def per_slot_reduce(self) -> Any:
        return self.values

    def cross_slot_reduce(self, per_slot_metrics: list) -> Any:
        # Interleave the processes' lists so values come back in global batch order when
        # each process updated once per batch of a batch-wise sharded loader.
        missing = object()
        merged = itertools.zip_longest(*per_slot_metrics, fillvalue=missing)
        return self.fn([v for row in merged for v in row if v is not missing])


class _WrappedReducer:
    """A registered reducer with its metric name and the workloads it applies to."""

    def __init__(
        self, reducer: MetricReducer, name: str | None, for_training: bool, for_validation: bool
    ) -> None:
        self.reducer = reducer
        self.name = name
        self.for_training = for_training
        self.for_validation = for_validation

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise InvalidTrialError(
                f"reducer {type(self.reducer).__name__} (name={self.name!r}) failed in {what}: "
                f"{exc}"
            ) from exc

    def reset(self) -> None:
        self._call("reset()", self.reducer.reset)

    def per_slot_reduce(self) -> Any:
        return self._call("per_slot_reduce()", self.reducer.per_slot_reduce)

    def cross_slot_reduce(self, per_slot: list) -> Any:
        return self._call("cross_slot_reduce()", lambda: self.reducer.cross_slot_reduce(per_slot))


T = TypeVar("T", bound=MetricReducer)


class ReducerRegistry:
    """The reducers a trial registered, reset and reduced per training window / validation."""

    def __init__(self, allgather: Callable[[Any], list]) -> None:
        self._wrapped: list[_WrappedReducer] = []
        self._allgather = allgather

    def wrap_reducer(
        self,
        reducer: Callable | MetricReducer,
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> Any:
        """Register a reducer function or `MetricReducer`; returns the object to `update()`."""
        if any(w.reducer is reducer for w in self._wrapped):
            raise InvalidTrialError(
                f"The reducer {type(reducer).__name__} was passed to wrap_reducer() twice; "
                "wrap each reducer object once and keep the returned object."
            )
        if not isinstance(reducer, MetricReducer) and not is_metric_reducer(reducer):
            if not callable(reducer):
                raise InvalidTrialError(
                    "wrap_reducer() takes a function of the list of updated values or a "
                    f"MetricReducer subclass instance; got {type(reducer).__name__}."
                )
            reducer = _SimpleReducer(reducer)
        metric_reducer = cast(MetricReducer, reducer)  # a MetricReducer, or duck-typed as one
        self._wrapped.append(_WrappedReducer(metric_reducer, name, for_training, for_validation))
        return reducer

    def reset(self) -> None:
        for wrapped in self._wrapped:
            wrapped.reset()

    def reduce(self, for_training: bool) -> dict[str, Any]:
        """Per-slot reduce, gather across processes, cross-slot reduce; returns named metrics."""
        active = [
            w for w in self._wrapped if (w.for_training if for_training else w.for_validation)
        ]
        if not active:
            return {}
        gathered = self._allgather([w.per_slot_reduce() for w in active])
        metrics: dict[str, Any] = {}
        for i, wrapped in enumerate(active):
            result = wrapped.cross_slot_reduce([slot[i] for slot in gathered])
            if wrapped.name is None:
                if not isinstance(result, dict):
                    raise InvalidTrialError(
                        f"reducer {type(wrapped.reducer).__name__} was wrapped without a name, so "
                        "it must return a dict of metric names to values; return a dict, or "
                        "pass name='...' to wrap_reducer()."
                    )
                metrics.update(result)
            else:
                if isinstance(result, dict):
                    raise InvalidTrialError(
                        f"reducer {type(wrapped.reducer).__name__} was wrapped with "
                        f"name={wrapped.name!r} but returned a dict; return a single value, or "
                        "wrap it with name=None to report several metrics."
                    )
                metrics[wrapped.name] = result
        return metrics
