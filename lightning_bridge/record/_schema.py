"""The registry's tables (SQLAlchemy ORM) and the states a trial and a checkpoint go through.

Trial states are Determined's: ACTIVE while it trains, COMPLETED when it reached its length (or
asked to stop early), STOPPED when a signal stopped it after a checkpoint, ERROR when it failed.
A checkpoint row is UPLOADING from the moment its files leave the trial's folder until the last
file is in storage, then COMPLETED; DELETED once retention removed it. Only COMPLETED checkpoints
are listed or continued from.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 1


class TrialState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"


class CheckpointState(enum.StrEnum):
    UPLOADING = "UPLOADING"
    COMPLETED = "COMPLETED"
    DELETED = "DELETED"


class _JsonText(TypeDecorator[Any]):
    """A JSON document kept as text: PostgreSQL's `json` refuses NaN and infinities, which a
    metric may be (SQLite keeps them as written, in its JSON column)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


# JSON columns: SQLite's JSON as before; text on PostgreSQL (a record shared across machines).
JSON_DOC = JSON().with_variant(_JsonText(), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON_DOC}


class Meta(Base):
    """One row per setting; `schema_version` guards against a registry from a newer release."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ExperimentRow(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict[str, Any]] = mapped_column(JSON_DOC)
    config_path: Mapped[str] = mapped_column(Text, default="")
    context_dir: Mapped[str] = mapped_column(Text, default="")
    # How the run was started (test mode, engine options): what `experiment continue` repeats.
    options: Mapped[dict[str, Any]] = mapped_column(JSON_DOC, default=dict)
    searcher_metric: Mapped[str | None] = mapped_column(String(256), nullable=True)
    smaller_is_better: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[float] = mapped_column(Float)


class TrialRow(Base):
    __tablename__ = "trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON_DOC)
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=TrialState.ACTIVE.value)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    batches_trained: Mapped[int] = mapped_column(Integer, default=0)
    epochs_trained: Mapped[int] = mapped_column(Integer, default=0)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str | None] = mapped_column(String(256), nullable=True)
    run_dir: Mapped[str] = mapped_column(Text, default="")
    log_file: Mapped[str] = mapped_column(Text, default="")
    message: Mapped[str] = mapped_column(Text, default="")
    # The checkpoint a `--resume` run started from (another trial's, or a foreign directory).
    source_checkpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    runs: Mapped[int] = mapped_column(Integer, default=0)


class MetricRow(Base):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_trial_kind_batches", "trial_id", "kind", "batches"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    kind: Mapped[str] = mapped_column(String(16))  # "training" or "validation"
    batches: Mapped[int] = mapped_column(Integer)
    epochs: Mapped[int] = mapped_column(Integer, default=0)
    values: Mapped[dict[str, Any]] = mapped_column(JSON_DOC)
    reported_at: Mapped[float] = mapped_column(Float)
    # Set when a continued trial went back to an earlier checkpoint: these were trained again.
    archived: Mapped[bool] = mapped_column(default=False)


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), default=CheckpointState.UPLOADING.value)
    batches: Mapped[int] = mapped_column(Integer)
    epochs: Mapped[int] = mapped_column(Integer, default=0)
    # The validation metrics of the batch it was taken at ({} if it was not validated).
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON_DOC, default=dict)
    location: Mapped[str] = mapped_column(Text)  # a directory path or a storage URL
    created_at: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    """Where a trial runs when a scheduler runs it (a Slurm job): one row per trial, updated as
    the scheduler reports it. A table of its own, so that a registry written before has it
    added on open."""

    __tablename__ = "jobs"
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), primary_key=True)
    launcher: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(32), default="PENDING")
    reason: Mapped[str] = mapped_column(Text, default="")
    output: Mapped[str] = mapped_column(Text, default="")  # the job's output file
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float)


class RunReportRow(Base):
    """What a trial's script said of itself beyond metrics (the Core API's `report_progress`,
    `set_status` and `set_metadata`): one row per trial, each report replacing the last. A
    table of its own, so that a registry written before has it added on open."""

    __tablename__ = "run_reports"
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), primary_key=True)
    progress: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Run metadata as `set_metadata` last gave it (None: never set).
    run_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON_DOC, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
