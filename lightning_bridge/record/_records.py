"""What the registry answers: plain, immutable records (no database session attached)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from lightning_bridge.record._schema import (
    CheckpointRow,
    ExperimentRow,
    JobRow,
    MetricRow,
    RunReportRow,
    TrialRow,
)

_Record = TypeVar("_Record")


def _copied(cls: type[_Record], row: Any, **given: Any) -> _Record:
    """A `cls` from the row's columns of the same names, detached from the session: JSON
    columns copied (None read as {}), booleans as bool; `given` fields as they are."""
    values = dict(given)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name in given:
            continue
        value = getattr(row, field.name)
        kind = str(field.type)  # the annotation's text (postponed annotations)
        if kind.startswith("dict"):
            value = dict(value or {})
        elif kind == "bool":
            value = bool(value)
        values[field.name] = value
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class Experiment:
    id: int
    name: str
    description: str
    config: dict[str, Any]
    config_path: str
    context_dir: str
    options: dict[str, Any]
    searcher_metric: str | None
    smaller_is_better: bool
    created_at: float

    @classmethod
    def of(cls, row: ExperimentRow) -> Experiment:
        return _copied(cls, row)

    def better(self, a: float, b: float) -> bool:
        """Whether searcher-metric value `a` beats `b`."""
        return a < b if self.smaller_is_better else a > b


@dataclasses.dataclass(frozen=True)
class Trial:
    id: int
    experiment_id: int
    hparams: dict[str, Any]
    seed: int | None
    state: str
    start_time: float | None
    end_time: float | None
    batches_trained: int
    epochs_trained: int
    pid: int | None
    host: str | None
    run_dir: str
    log_file: str
    message: str
    source_checkpoint: str | None
    runs: int

    @classmethod
    def of(cls, row: TrialRow) -> Trial:
        return _copied(cls, row)


@dataclasses.dataclass(frozen=True)
class Metric:
    trial_id: int
    kind: str
    batches: int
    epochs: int
    values: dict[str, Any]
    reported_at: float

    @classmethod
    def of(cls, row: MetricRow) -> Metric:
        return _copied(cls, row)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    uuid: str
    trial_id: int
    experiment_id: int
    state: str
    batches: int
    epochs: int
    metrics: dict[str, Any]
    location: str
    created_at: float

    @classmethod
    def of(cls, row: CheckpointRow, experiment_id: int) -> Checkpoint:
        return _copied(cls, row, experiment_id=experiment_id)


@dataclasses.dataclass(frozen=True)
class Job:
    """A trial's scheduler job: its id, last known state and output file."""

    trial_id: int
    launcher: str
    job_id: str
    state: str
    reason: str
    output: str
    restarts: int
    updated_at: float

    @classmethod
    def of(cls, row: JobRow) -> Job:
        return _copied(cls, row)


def as_dict(record: Any) -> dict[str, Any]:
    """A record as a JSON-ready dict (for `--json`)."""
    return dataclasses.asdict(record)


@dataclasses.dataclass(frozen=True)
class RunReport:
    """A trial's last progress (0 to 1), status line and run metadata, as its script
    reported them (None: not reported)."""

    trial_id: int
    progress: float | None
    status: str | None
    run_metadata: dict[str, Any] | None

    @classmethod
    def of(cls, row: RunReportRow) -> RunReport:
        metadata = row.run_metadata
        return cls(
            row.trial_id, row.progress, row.status, None if metadata is None else dict(metadata)
        )
