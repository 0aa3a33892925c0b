"""What the registry answers: plain, immutable records (no database session attached)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_bridge.record._schema import (
    CheckpointRow,
    ExperimentRow,
    JobRow,
    MetricRow,
    TrialRow,
)


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
        return cls(
            id=row.id,
            name=row.name,
            description=row.description,
            config=dict(row.config or {}),
            config_path=row.config_path,
            context_dir=row.context_dir,
            options=dict(row.options or {}),
            searcher_metric=row.searcher_metric,
            smaller_is_better=bool(row.smaller_is_better),
            created_at=row.created_at,
        )

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
        return cls(
            id=row.id,
            experiment_id=row.experiment_id,
            hparams=dict(row.hparams or {}),
            seed=row.seed,
            state=row.state,
            start_time=row.start_time,
            end_time=row.end_time,
            batches_trained=row.batches_trained,
            epochs_trained=row.epochs_trained,
            pid=row.pid,
            host=row.host,
            run_dir=row.run_dir,
            log_file=row.log_file,
            message=row.message,
            source_checkpoint=row.source_checkpoint,
            runs=row.runs,
        )


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
        return cls(
            trial_id=row.trial_id,
            kind=row.kind,
            batches=row.batches,
            epochs=row.epochs,
            values=dict(row.values or {}),
            reported_at=row.reported_at,
        )


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
        return cls(
            uuid=row.uuid,
            trial_id=row.trial_id,
            experiment_id=experiment_id,
            state=row.state,
            batches=row.batches,
            epochs=row.epochs,
            metrics=dict(row.metrics or {}),
            location=row.location,
            created_at=row.created_at,
        )


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
        return cls(
            trial_id=row.trial_id,
            launcher=row.launcher,
            job_id=row.job_id,
            state=row.state,
            reason=row.reason,
            output=row.output,
            restarts=row.restarts,
            updated_at=row.updated_at,
        )


def as_dict(record: Any) -> dict[str, Any]:
    """A record as a JSON-ready dict (for `--json`)."""
    return dataclasses.asdict(record)
