"""`core_context.searcher`: the training length a script is asked for. As on Determined 0.38
the searcher yields one operation: of length 1 off a run (the off-cluster answer), of the
config's `searcher.max_length` under `lightning-bridge run`. A search stops a trial early
through the preemption signal, not through operations."""

from __future__ import annotations

import enum
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from lightning_bridge.contract._distributed import DistributedContext

logger = logging.getLogger("lightning_bridge.core")


class SearcherMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


_UNITS = {"epochs": Unit.EPOCHS, "records": Unit.RECORDS, "batches": Unit.BATCHES}


class SearcherOperation:
    """Train to `length`; report progress along the way and the searcher metric at the end."""

    def __init__(self, length: int, is_chief: bool) -> None:
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        if not self._is_chief:
            raise RuntimeError("only the chief (rank 0) may report an operation's progress.")
        if self._completed and length != self._length:
            raise RuntimeError("report_progress() after report_completed() must not change it.")
        logger.info("progress report: %s/%s", length, self._length)

    def report_completed(self, searcher_metric: float) -> None:
        if not self._is_chief:
            raise RuntimeError("only the chief (rank 0) may complete an operation.")
        if self._completed:
            raise RuntimeError("report_completed() was already called for this operation.")
        self._completed = True
        logger.info("SearcherOperation Complete: searcher_metric=%s", searcher_metric)


def configured_length(config: Mapping[str, Any]) -> tuple[int | None, Unit | None]:
    """`searcher.max_length` of an experiment config and its unit (None: not given; a bare
    number has no unit), as Determined's Core API reads them."""
    searcher = config.get("searcher") or {}
    length = searcher.get("max_length")
    unit = None
    if isinstance(length, Mapping):
        if len(length) == 1:
            unit = _UNITS.get(str(next(iter(length))))
        length = next(iter(length.values()), None)
    if "unit" in searcher:
        unit = _UNITS.get(str(searcher["unit"]))
    return (int(length) if isinstance(length, int) and length else None), unit


class SearcherContext:
    """One operation (see the module docstring), agreed across ranks."""

    def __init__(
        self, dist: DistributedContext, length: int = 1, units: Unit | None = Unit.EPOCHS
    ) -> None:
        self._dist = dist
        self._length = length
        self._units = units

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        warnings.warn(
            "SearcherContext.operations() was deprecated in Determined 0.38.0: set the training "
            "length in the training code instead.",
            FutureWarning,
            stacklevel=2,
        )
        mode = SearcherMode(searcher_mode)
        if self._dist.rank == 0:
            op = SearcherOperation(self._length, True)
            if mode == SearcherMode.WorkersAskChief:
                self._dist.broadcast(op.length)
            yield op
            if not op._completed:
                raise RuntimeError("call op.report_completed() on each searcher operation.")
            if mode == SearcherMode.WorkersAskChief:
                self._dist.broadcast(None)
            return
        if mode != SearcherMode.WorkersAskChief:
            raise RuntimeError("searcher_mode=ChiefOnly is for the chief (rank 0) only.")
        while (length := self._dist.broadcast(None)) is not None:
            yield SearcherOperation(length, False)

    def acknowledge_out_of_ops(self) -> None:
        """Nothing to acknowledge off a run."""

    def get_configured_units(self) -> Unit | None:
        return self._units


_MISSING = (
    "SearcherContext was not created because your experiment config does not have the "
    "searcher.max_length set. Both searcher.max_length and the SearcherContext are deprecated "
    "(Determined 0.38): set the training length in the training code instead and avoid "
    "core_context.searcher."
)


class SearcherContextMissing(SearcherContext):
    """A run whose config has no `searcher.max_length`: every call says so (as Determined)."""

    def __init__(self) -> None:
        pass

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        raise ValueError(_MISSING)

    def acknowledge_out_of_ops(self) -> None:
        raise ValueError(_MISSING)

    def get_configured_units(self) -> Unit | None:
        raise ValueError(_MISSING)
