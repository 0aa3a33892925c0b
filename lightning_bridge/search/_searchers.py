"""The `searcher` section: Determined 0.38's searchers as pydantic models, with its defaults.

`single`, `random`, `grid`, `async_halving` and `adaptive_asha`, told apart by `name`; the keys
they share (`metric`, `smaller_is_better`, `max_length` or `max_time` + `time_metric`, the warm
start's `source_trial_id` / `source_checkpoint_uuid`) are on every one. Keys Determined's
searchers have but this one does not use are kept (the command reports them as unused).
Searchers Determined removed are refused with one message each (`REMOVED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

SEARCHER_NAMES = ("single", "random", "grid", "adaptive_asha", "async_halving")
REMOVED = {
    "custom": "the custom searcher was removed from Determined (0.38) and has no equivalent "
    "here; use random, grid or adaptive_asha",
    "pbt": "the pbt (population-based training) searcher was removed from Determined; use "
    "adaptive_asha, which stops the weak configurations early in the same spirit",
    "adaptive_simple": "the adaptive_simple searcher was removed from Determined; use "
    "adaptive_asha (the same brackets of successive halving, asynchronous)",
    "adaptive": "the adaptive searcher was removed from Determined; use adaptive_asha (the "
    "same brackets of successive halving, asynchronous)",
    "sync_halving": "the sync_halving searcher was removed from Determined; use async_halving "
    "(successive halving without waiting for a whole rung)",
}
UNITS = ("batches", "records", "epochs")


class OneUnit(BaseModel):
    """A length given in exactly one unit; subclasses declare the three with their bounds."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @pydantic.model_validator(mode="after")
    def _one_unit(self) -> OneUnit:
        if sum(getattr(self, unit) is not None for unit in UNITS) != 1:
            raise ValueError("expected exactly one of batches, records or epochs")
        return self

    def unit_and_value(self) -> tuple[str, int]:
        unit = next(u for u in UNITS if getattr(self, u) is not None)
        return unit, int(getattr(self, unit))


class MaxLength(OneUnit):
    """`{batches: N}`, `{records: N}` or `{epochs: N}` with N > 0."""

    batches: Annotated[StrictInt, Field(gt=0)] | None = None
    records: Annotated[StrictInt, Field(gt=0)] | None = None
    epochs: Annotated[StrictInt, Field(gt=0)] | None = None


_Count = Annotated[StrictInt, Field(ge=1)]
_Concurrency = Annotated[StrictInt, Field(ge=0)]
_Divisor = Annotated[float, Field(gt=1)]


class _Searcher(BaseModel):
    """The keys every searcher has."""

    model_config = ConfigDict(extra="allow", strict=True)

    metric: StrictStr | None = None
    smaller_is_better: StrictBool = True
    source_trial_id: StrictInt | None = None
    source_checkpoint_uuid: StrictStr | None = None
    # A bare integer is accepted as Determined accepts it (no unit: a script's
    # `fit(max_length=...)` gives the length; no trial class or ASHA can use it).
    max_length: MaxLength | Annotated[StrictInt, Field(ge=0)] | None = None
    # The searcher's time: `max_time` units of `time_metric`, a validation metric the trial
    # reports (`batches` and `epochs` are added to every validation, as Determined's harness
    # does; a trial may report `samples` or its own). Given with `max_length`, as a legacy
    # trial class's ASHA config has it, `max_length` is the trial's length and `max_time` the
    # rungs', as in Determined 0.38.
    max_time: Annotated[StrictInt, Field(gt=0)] | None = None
    time_metric: Annotated[StrictStr, Field(min_length=1)] | None = None

    @pydantic.model_validator(mode="after")
    def _lengths(self) -> _Searcher:
        if (self.max_time is None) != (self.time_metric is None):
            raise ValueError("max_time and time_metric go together: set both or neither")
        return self

    def length(self) -> tuple[str, int] | None:
        """The longest training as (unit, value): `max_time` in `time_metric`, else the legacy
        `max_length`; None when neither is set."""
        if self.max_time is not None and self.time_metric is not None:
            return self.time_metric, self.max_time
        if isinstance(self.max_length, MaxLength):
            return self.max_length.unit_and_value()
        return None


class SingleSearcher(_Searcher):
    name: Literal["single"] = "single"


class _MultiTrial(_Searcher):
    """Searchers of several trials rank them by `metric`, so it is required."""

    metric: StrictStr


class RandomSearcher(_MultiTrial):
    name: Literal["random"]
    max_trials: _Count
    max_concurrent_trials: _Concurrency = 16


class GridSearcher(_MultiTrial):
    name: Literal["grid"]
    max_concurrent_trials: _Concurrency = 16


class _Halving(_MultiTrial):
    """ASHA's common keys; the longest training is required (rungs are fractions of it)."""

    max_trials: _Count
    divisor: _Divisor = 4.0
    max_concurrent_trials: _Concurrency = 16
    stop_once: StrictBool | None = None  # legacy, accepted and unused, as in Determined 0.38

    @pydantic.model_validator(mode="after")
    def _needs_length(self) -> _Halving:
        if self.length() is None:
            raise ValueError(
                f"the {getattr(self, 'name')} searcher needs max_time and time_metric (the "  # noqa: B009
                "length of the longest training, e.g. max_time: 1000, time_metric: batches)"
            )
        return self


class AsyncHalvingSearcher(_Halving):
    name: Literal["async_halving"]
    num_rungs: _Count


class AdaptiveAshaSearcher(_Halving):
    name: Literal["adaptive_asha"]
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    max_rungs: _Count = 5
    bracket_rungs: list[_Count] = Field(default_factory=list)


SearcherConfig: TypeAlias = (
    SingleSearcher | RandomSearcher | GridSearcher | AsyncHalvingSearcher | AdaptiveAshaSearcher
)
SEARCHER: pydantic.TypeAdapter[SearcherConfig] = pydantic.TypeAdapter(
    Annotated[SearcherConfig, Field(discriminator="name")]
)


def searcher_of(config: Mapping[str, Any]) -> SearcherConfig | None:
    """The `searcher` section of an experiment config as its model (a recorded experiment's
    config was validated when it was made); None without one, or when it does not validate."""
    section = config.get("searcher")
    if not isinstance(section, Mapping):
        return None
    try:
        return SEARCHER.validate_python(section)
    except pydantic.ValidationError:
        return None
