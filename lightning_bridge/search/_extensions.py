"""Determined's searcher on Optuna's extension points: a sampler and a pruner.

`DeterminedSampler` gives each trial its configuration, as Determined's searchers draw it: the
`request`-th trial of a search gets `trial_draw(space, experiment_seed, request)` (its trial
seed and values), a grid trial its grid point. Optuna sees the searched hyperparameters as
`params` (what `optuna-dashboard` and `study.trials_dataframe()` show): flattened to dotted
names (`optimizer.lr`), each with the distribution of its form (`int` an IntDistribution,
`double` a FloatDistribution, `log` a log-scaled FloatDistribution over
base**minval..base**maxval, a categorical a CategoricalDistribution of its values, or of their
JSON text when a value is a list or mapping); constants are not parameters. The values a trial
trains with are kept whole beside them (the `TRIAL` user attr).

`DeterminedPruner` is Determined's stop rule at rungs (`_methods`): asked by
`Trial.should_prune` after a report, it ranks the trial's metric in the rungs it reached among
its bracket's peers. Its decision changes the search (the trial's rungs, the replacement a stop
starts), which a pruner cannot write: `outcome` keeps it for the caller, who persists it under
the search's lock.

Both need Optuna; `SearchDriver` imports this module when it opens a study.
"""

from __future__ import annotations

import json
import math
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from lightning_bridge.search._attempts import TRIAL, current_attempts, record_of
from lightning_bridge.search._methods import Create, Method, Record, signed
from lightning_bridge.search._space import (
    CategoricalForm,
    DoubleForm,
    Form,
    IntForm,
    LogForm,
    Space,
    leaves,
    trial_draw,
)

_PLAIN = (type(None), bool, int, float, str)


def _plain(form: CategoricalForm) -> bool:
    return all(isinstance(v, _PLAIN) for v in form.vals)


def _distribution(form: Form) -> BaseDistribution | None:
    if isinstance(form, IntForm):
        return IntDistribution(form.minval, form.maxval)
    if isinstance(form, DoubleForm):
        return FloatDistribution(form.minval, form.maxval)
    if isinstance(form, LogForm):
        ends = sorted((math.pow(form.base, form.minval), math.pow(form.base, form.maxval)))
        # base 1: one value, nothing to show as a range
        return FloatDistribution(ends[0], ends[1], log=True) if ends[0] < ends[1] else None
    if isinstance(form, CategoricalForm):
        if _plain(form):
            return CategoricalDistribution(form.vals)
        return CategoricalDistribution([json.dumps(v, sort_keys=True) for v in form.vals])
    return None  # a constant


def distributions(space: Space) -> dict[str, BaseDistribution]:
    """The Optuna distributions of a space's searched hyperparameters, by dotted name."""
    dists = {}
    for path, form in leaves(space):
        dist = _distribution(form)
        if dist is not None:
            dists[".".join(path)] = dist
    return dists


def params(space: Space, hparams: dict[str, Any]) -> dict[str, Any]:
    """A trial's Optuna `params` for its values `hparams`."""
    out: dict[str, Any] = {}
    for path, form in leaves(space):
        dist = _distribution(form)
        if dist is None:
            continue
        value: Any = hparams
        for key in path:
            value = value[key]
        if isinstance(form, CategoricalForm) and not _plain(form):
            value = json.dumps(value, sort_keys=True)
        if isinstance(dist, FloatDistribution):
            # Grid points and powers may round a last bit past an end of the range.
            value = min(max(float(value), dist.low), dist.high)
        out[".".join(path)] = value
    return out


class DeterminedSampler(optuna.samplers.BaseSampler):
    """The configuration of each trial of a search, as Determined's searchers draw it."""

    def __init__(self, space: Space, experiment_seed: int) -> None:
        self.space = space
        self.experiment_seed = experiment_seed

    def configuration(
        self, request: int, point: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """The trial seed and values of the search's `request`-th trial (`point`: its grid
        point, for the grid searcher)."""
        seed, hparams = trial_draw(self.space, self.experiment_seed, request)
        return seed, hparams if point is None else point

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        """The value the trial's configuration (decided when the searcher created it) has for
        `param_name`."""
        return params(self.space, trial.user_attrs[TRIAL]["hparams"])[param_name]


class DeterminedPruner(optuna.pruners.BasePruner):
    """Determined's stop rule at rungs; `outcome` keeps what the last decision changed."""

    def __init__(self, method: Method, smaller_is_better: bool) -> None:
        self.method = method
        self.smaller_is_better = smaller_is_better
        # The last decision: every trial's record (the reporting one updated) and the trials
        # to create.
        self.outcome: tuple[list[Record], Record, list[Create]] | None = None

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        attempts = current_attempts(study.get_trials(deepcopy=False))
        records = [record_of(a) for a in attempts.values()]
        request = int(trial.user_attrs[TRIAL]["request"])
        record = next(r for r in records if r.number == request)
        metric = signed(float(trial.intermediate_values[step]), self.smaller_is_better)
        stop, creates = self.method.on_report(records, record, step, metric)
        self.outcome = (records, record, creates)
        return stop
