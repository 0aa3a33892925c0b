"""Training units: `Batch` and `Epoch` lengths, periods and schedules.

A unit holds either an int (a length, or a period that fires every N units) or a container of
unit numbers (a schedule that fires exactly at those numbers). Epoch-based units fire on the last
batch of an epoch, since the bridge, like Determined, counts training in batches.
"""

from __future__ import annotations

import sys
from collections import abc
from typing import Any

from lightning_bridge._errors import ArgumentTypeError, InvalidArgumentError
from lightning_bridge.contract._determined_compat import is_determined_object


class TrainUnit:
    """Base class of `Batch` and `Epoch`; `value` is an int period or a container schedule."""

    def __init__(self, value: int | abc.Container) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TrainUnit) and type(self) is type(other) and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self.value)))

    def should_stop(self, step_num: int) -> bool:
        """Whether a period or schedule fires after `step_num` completed units."""
        if isinstance(self.value, int):
            if self.value < 1:
                return True
            return step_num != 0 and step_num % self.value == 0
        return step_num in self.value

    @staticmethod
    def _from_values(
        batches: int | None = None,
        records: int | None = None,
        epochs: int | None = None,
        global_batch_size: int | None = None,
    ) -> TrainUnit:
        """Build a unit from exactly one of batches / records / epochs (config-file lengths)."""
        given = [v is not None for v in (batches, records, epochs)]
        if sum(given) != 1:
            raise InvalidArgumentError(
                "Give exactly one of batches, records or epochs; got "
                f"batches={batches}, records={records}, epochs={epochs}."
            )
        if batches is not None:
            return Batch(batches if batches >= 1 else sys.maxsize)
        if epochs is not None:
            return Epoch(epochs if epochs >= 1 else sys.maxsize)
        assert records is not None
        if not global_batch_size:
            raise InvalidArgumentError(
                "A length in records needs the global_batch_size hyperparameter to convert "
                "records to batches; add global_batch_size to the hyperparameters."
            )
        return Batch._from_records(records if records >= 1 else sys.maxsize, global_batch_size)


class Batch(TrainUnit):
    """A length, period or schedule counted in batches, e.g. `Batch(100)` or `Batch([5, 30])`."""

    @staticmethod
    def _from_records(records: int, global_batch_size: int) -> Batch:
        return Batch(max(records // global_batch_size, 1))


class Epoch(TrainUnit):
    """A length, period or schedule counted in epochs, e.g. `Epoch(1)` or `Epoch([1, 5])`."""


def as_bridge_unit(value: Any) -> Any:
    """Determined's `Batch(n)` / `Epoch(n)` become the bridge's."""
    for unit in (Batch, Epoch):
        if is_determined_object(value, unit.__name__):
            return unit(value.value)
    return value


def check_period(name: str, unit: Any) -> TrainUnit:
    """Validate a period argument of `fit` (int or container value) and return it."""
    unit = as_bridge_unit(unit)
    if not isinstance(unit, TrainUnit):
        raise InvalidArgumentError(
            f"{name} must be a Batch or Epoch, e.g. {name}=Batch(100) or {name}=Epoch(1); "
            f"got {unit!r} of type {type(unit).__name__}."
        )
    value = unit.value
    if isinstance(value, bool) or not isinstance(value, (int, abc.Container)):
        raise InvalidArgumentError(
            f"{name} must hold an int period or a container schedule such as a list; got {unit!r}."
        )
    # A string is a container too (`step in "4"` fails at the first batch), as is a list of
    # strings; a range holds integers by construction (and may be too long to look through).
    if isinstance(value, (str, bytes)) or (
        isinstance(value, abc.Iterable)
        and not isinstance(value, range)
        and any(isinstance(v, bool) or not isinstance(v, int) for v in value)
    ):
        kind = "epochs" if isinstance(unit, Epoch) else "batches"
        raise InvalidArgumentError(
            f"{name} must count {kind} with integers, e.g. {name}={type(unit).__name__}(4) or "
            f"{type(unit).__name__}([2, 5]); got {unit!r}."
        )
    return unit


def check_length(unit: Any) -> TrainUnit:
    """Validate `max_length`: required, and a `Batch(int)` or `Epoch(int)`."""
    unit = as_bridge_unit(unit)
    if unit is None:
        raise InvalidArgumentError(
            "fit() needs max_length: say how long to train, e.g. "
            "trainer.fit(max_length=Epoch(1)) or trainer.fit(max_length=Batch(1000))."
        )
    if (
        not isinstance(unit, (Batch, Epoch))
        or isinstance(unit.value, bool)
        or not isinstance(unit.value, int)
    ):
        raise ArgumentTypeError(
            "max_length must be a Batch(int) or an Epoch(int), e.g. max_length=Epoch(2); "
            f"got {unit!r}."
        )
    return unit
