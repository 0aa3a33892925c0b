"""Accept Determined's own contract objects where the bridge's are expected.

A trial that still imports `determined.pytorch` (when Determined is installed) hands the bridge
Determined's `Reducer` and `LRScheduler.StepMode` members, `Batch` / `Epoch` units and
`MetricReducer` subclasses. They are matched by name and shape, never by importing Determined,
and mapped onto the bridge's equivalents.
"""

from __future__ import annotations

import enum
from typing import Any


def is_determined_object(obj: Any, class_name: str) -> bool:
    """Whether `obj` is an instance of Determined's class `class_name`."""
    cls = type(obj)
    return cls.__name__ == class_name and cls.__module__.startswith("determined.")


def as_bridge_enum(value: Any, bridge_enum: type[enum.Enum]) -> Any:
    """Determined's member of the same-named enum becomes the bridge's member of that name."""
    if isinstance(value, bridge_enum):
        return value
    if isinstance(value, enum.Enum) and is_determined_object(value, bridge_enum.__name__):
        return bridge_enum[value.name]
    return value


def is_metric_reducer(value: Any) -> bool:
    """Determined's `MetricReducer` subclasses (same three methods) count as metric reducers."""
    return all(callable(getattr(value, m, None)) for m in ("reset", "per_slot_reduce")) and (
        callable(getattr(value, "cross_slot_reduce", None))
    )
