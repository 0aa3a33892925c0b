"""Hyperparameter spaces: Determined's hyperparameter forms, validated and sampled.

A space is the `hyperparameters` section as a tree: a mapping whose leaves are forms (`const`,
`int`, `double`, `log`, `categorical`) and whose inner mappings without a `type` key are nested
groups. A plain value (a number, a string, a list) is a constant, as in Determined. Sampling
follows Determined's forms: `int` draws from both ends included, `double` uniformly, `log` draws
the exponent uniformly and raises `base` to it, `categorical` picks one of `vals` (any YAML
value, lists and mappings included).
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypeAlias

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictInt

HP_TYPES = ("const", "int", "double", "log", "categorical")


class _Form(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Range(_Form):
    """`minval` < `maxval`, as Determined's schema requires; `count` is the grid's points."""

    count: Annotated[StrictInt, Field(ge=1)] | None = None

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> _Range:
        if not getattr(self, "minval") < getattr(self, "maxval"):  # noqa: B009
            raise ValueError("minval must be less than maxval")
        return self


class ConstForm(_Form):
    type: Literal["const"]
    val: Any


class IntForm(_Range):
    type: Literal["int"]
    minval: StrictInt
    maxval: StrictInt


class DoubleForm(_Range):
    type: Literal["double"]
    minval: float
    maxval: float


class LogForm(_Range):
    type: Literal["log"]
    base: float
    minval: float
    maxval: float

    @pydantic.field_validator("base")
    @classmethod
    def _positive(cls, base: float) -> float:
        if not base > 0:
            raise ValueError("expected a positive number")
        return base


class CategoricalForm(_Form):
    type: Literal["categorical"]
    vals: Annotated[list[Any], Field(min_length=1)]


Form: TypeAlias = ConstForm | IntForm | DoubleForm | LogForm | CategoricalForm
# A space: names to forms or nested spaces (groups).
Space: TypeAlias = dict[str, "Form | Space"]
# Where a problem is (the key path) and what it is: pydantic's errors or one sentence.
Problem: TypeAlias = tuple[tuple[str, ...], "pydantic.ValidationError | str"]

HP_FORM: pydantic.TypeAdapter[Form] = pydantic.TypeAdapter(
    Annotated[Form, Field(discriminator="type")], config=ConfigDict(strict=False)
)


def parse_space(
    values: dict[str, Any], path: tuple[str, ...] = ("hyperparameters",)
) -> tuple[Space, list[Problem]]:
    """The space of a `hyperparameters` mapping, and every malformed form found in it."""
    space: Space = {}
    problems: list[Problem] = []
    for key, value in values.items():
        where = (*path, str(key))
        if isinstance(value, dict) and "type" in value:
            try:
                space[str(key)] = HP_FORM.validate_python(value)
            except pydantic.ValidationError as exc:
                problems.append((where, exc))
        elif isinstance(value, dict):
            space[str(key)], inner = parse_space(value, where)
            problems.extend(inner)
        else:
            space[str(key)] = ConstForm(type="const", val=value)
    return space, problems


def leaves(space: Space, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Form]]:
    """Every form of the space with its key path, in Determined's order (names sorted)."""
    for key in sorted(space):
        node = space[key]
        if isinstance(node, dict):
            yield from leaves(node, (*path, key))
        else:
            yield (*path, key), node


def flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A trial's nested hyperparameter values as dotted keys (`optimizer.lr`), as tables and
    MLflow's params show them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def is_constant(space: Space) -> bool:
    """Whether every hyperparameter has one value (no range or categorical to search)."""
    return all(isinstance(form, ConstForm) for _, form in leaves(space))


def sample(space: Space, rng: random.Random) -> dict[str, Any]:
    """One configuration drawn from the space: names drawn in sorted order (Determined's), the
    result in the config's order."""
    drawn: dict[str, Any] = {}
    for key in sorted(space):
        node = space[key]
        drawn[key] = sample(node, rng) if isinstance(node, dict) else _draw(node, rng)
    return {key: drawn[key] for key in space}


def _draw(form: Form, rng: random.Random) -> Any:
    if isinstance(form, ConstForm):
        return copy.deepcopy(form.val)
    if isinstance(form, IntForm):
        return form.minval + rng.randrange(form.maxval - form.minval + 1)
    if isinstance(form, DoubleForm):
        return rng.uniform(form.minval, form.maxval)
    if isinstance(form, LogForm):
        return math.pow(form.base, rng.uniform(form.minval, form.maxval))
    return copy.deepcopy(form.vals[rng.randrange(len(form.vals))])


def trial_rng(experiment_seed: int, request: int) -> random.Random:
    """The random stream of one trial of a search: a function of the experiment seed and the
    trial's creation index only, so a search is reproducible whichever process creates it."""
    digest = hashlib.sha256(f"lightning-bridge:{experiment_seed}:{request}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def trial_draw(space: Space, experiment_seed: int, request: int) -> tuple[int, dict[str, Any]]:
    """The trial seed (0 to 2**31 - 1, as Determined's) and sampled hyperparameters of the
    `request`-th trial of a search."""
    rng = trial_rng(experiment_seed, request)
    seed = rng.randrange(1 << 31)
    return seed, sample(space, rng)
