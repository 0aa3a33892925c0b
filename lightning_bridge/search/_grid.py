"""The grid searcher's points: Determined's grid of a hyperparameter space.

Each `int`, `double` and `log` form gives `count` points (required by the grid searcher),
a categorical its `vals`, a constant its value; the grid is the Cartesian product of these axes,
names in sorted order, the first name varying slowest. Points of a range, for i in 0..count-1:

- `int`: round(minval + i * (maxval - minval) / (count - 1)), rounding halves away from zero,
  with count first clamped to the number of integers in the range;
- `double`: minval + i * (maxval - minval) / (count - 1);
- `log`: base ** (minval + i * (maxval - minval) / (count - 1));
- `count: 1`: the midpoint (of the exponents for `log`).
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

from lightning_bridge.search._space import (
    CategoricalForm,
    ConstForm,
    DoubleForm,
    Form,
    IntForm,
    LogForm,
    Space,
)

# One value of one axis: the key path it is set at, and the value.
_AxisValue = tuple[tuple[str, ...], Any]


def round_half_away(value: float) -> int:
    """Round to the nearest integer, halves away from zero (Go's math.Round, not Python's
    round-half-to-even)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def axis(form: Form) -> list[Any]:
    """The values one form contributes to the grid."""
    if isinstance(form, ConstForm):
        return [form.val]
    if isinstance(form, CategoricalForm):
        return list(form.vals)
    assert form.count is not None, "the grid searcher checks every range has a count"
    if isinstance(form, IntForm):
        count = min(form.count, form.maxval - form.minval + 1)
        if count == 1:
            return [round_half_away((form.minval + form.maxval) / 2.0)]
        width = form.maxval - form.minval
        return [round_half_away(form.minval + i * width / (count - 1)) for i in range(count)]
    if isinstance(form, DoubleForm | LogForm):
        count = form.count
        if count == 1:
            points = [(form.minval + form.maxval) / 2.0]
        else:
            span = form.maxval - form.minval
            points = [form.minval + i * span / (count - 1) for i in range(count)]
        if isinstance(form, LogForm):
            return [math.pow(form.base, p) for p in points]
        return points
    raise TypeError(f"unexpected hyperparameter form {form!r}")


def _axes(space: Space, path: tuple[str, ...]) -> list[list[_AxisValue]]:
    axes: list[list[_AxisValue]] = []
    for key in sorted(space):
        node = space[key]
        route = (*path, key)
        if isinstance(node, dict):
            # An empty group stays in every point as an empty mapping.
            axes.extend(_axes(node, route) if node else [[(route, {})]])
        else:
            axes.append([(route, value) for value in axis(node)])
    return axes


def missing_counts(space: Space, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths of the ranges that have no `count` (the grid searcher needs one on each)."""
    missing = []
    for key in sorted(space):
        node = space[key]
        if isinstance(node, dict):
            missing.extend(missing_counts(node, (*path, key)))
        elif isinstance(node, IntForm | DoubleForm | LogForm) and node.count is None:
            missing.append((*path, key))
    return missing


def grid_points(space: Space) -> list[dict[str, Any]]:
    """Every point of the grid, in Determined's order (an empty space has no point)."""
    axes = _axes(space, ())
    if not axes:
        return []
    points = []
    for combination in itertools.product(*axes):
        point: dict[str, Any] = {}
        for route, value in combination:
            node = point
            for key in route[:-1]:
                node = node.setdefault(key, {})
            node[route[-1]] = copy.deepcopy(value)
        points.append(point)
    return points
