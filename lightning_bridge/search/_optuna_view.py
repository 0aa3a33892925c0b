"""How a search's trials read in Optuna: parameters with distributions, states.

Optuna tools (`optuna-dashboard`, `study.trials_dataframe()`) show a trial's `params`; these
are the searched hyperparameters flattened to dotted names (`optimizer.lr`), each with the
distribution of its form: `int` an IntDistribution, `double` a FloatDistribution, `log` a
log-scaled FloatDistribution over base**minval..base**maxval, a categorical of plain values
a CategoricalDistribution of them (of their JSON text when a value is a list or mapping).
Constants are not parameters. The values the trial trains with are kept whole beside them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lightning_bridge.search._space import (
    CategoricalForm,
    ConstForm,
    DoubleForm,
    IntForm,
    LogForm,
    Space,
    leaves,
)

_PLAIN = (type(None), bool, int, float, str)


def _plain(values: list[Any]) -> bool:
    return all(isinstance(v, _PLAIN) for v in values)


def _lookup(hparams: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = hparams
    for key in path:
        node = node[key]
    return node


def params_and_distributions(
    space: Space, hparams: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A trial's Optuna `params` and `distributions` for its sampled `hparams`."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    params: dict[str, Any] = {}
    dists: dict[str, Any] = {}
    for path, form in leaves(space):
        if isinstance(form, ConstForm):
            continue
        name = ".".join(path)
        value = _lookup(hparams, path)
        if isinstance(form, IntForm):
            dists[name] = IntDistribution(form.minval, form.maxval)
        elif isinstance(form, DoubleForm):
            dists[name] = FloatDistribution(form.minval, form.maxval)
        elif isinstance(form, LogForm):
            ends = sorted((math.pow(form.base, form.minval), math.pow(form.base, form.maxval)))
            if ends[0] == ends[1]:
                continue  # base 1: one value, nothing to show as a range
            dists[name] = FloatDistribution(ends[0], ends[1], log=True)
        elif isinstance(form, CategoricalForm):
            if _plain(form.vals):
                dists[name] = CategoricalDistribution(form.vals)
            else:
                choices = [json.dumps(v, sort_keys=True) for v in form.vals]
                dists[name] = CategoricalDistribution(choices)
                value = json.dumps(value, sort_keys=True)
        if isinstance(dists[name], FloatDistribution):
            # Grid points and powers may round a last bit past an end of the range.
            value = min(max(float(value), dists[name].low), dists[name].high)
        params[name] = value
    return params, dists
