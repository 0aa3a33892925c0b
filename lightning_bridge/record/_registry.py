"""`Registry`: the experiment record of one workspace, in SQLite through SQLAlchemy (or in a
PostgreSQL database the workspace's settings name, when trials on several machines write it:
`_settings`, `_postgres`).

Several processes write at once (the runner, each trial's own process, the commands): every
write is one short transaction on the engine of `_sqlite` (WAL mode, a generous busy timeout),
so writers queue instead of failing and readers never see half a write. Each commit is synced
to disk, so what was recorded survives a crash of any process.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._process import pid_alive
from lightning_bridge.record._postgres import postgres_engine, shown
from lightning_bridge.record._records import Checkpoint, Experiment, Job, Metric, RunReport, Trial
from lightning_bridge.record._schema import (
    SCHEMA_VERSION,
    Base,
    CheckpointRow,
    CheckpointState,
    ExperimentRow,
    JobRow,
    Meta,
    MetricRow,
    RunReportRow,
    TrialRow,
    TrialState,
)
from lightning_bridge.record._settings import WorkspaceSettings
from lightning_bridge.record._sqlite import BUSY_TIMEOUT_S, sqlite_engine
from lightning_bridge.record._unusable import record_unreachable, unusable_registry
from lightning_bridge.record._workspace import Workspace

# A metric group's name (Determined forbids "." in one; the record keeps 16 characters).
_GROUP = re.compile(r"[A-Za-z0-9_-]{1,16}")

# A scheduler job in one of these states may still run the trial (Slurm's names). A running
# job passes through SIGNALING (its `--signal` being sent before the time limit), STAGE_OUT and
# RESIZING; a held, stopped or federated requeue waits to run again.
LIVE_JOB_STATES = (
    "PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "SIGNALING",
    "STAGE_OUT", "RESIZING", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED",
)  # fmt: skip


def plain_metrics(values: dict[str, Any]) -> dict[str, Any]:
    """Metric values as JSON numbers (tensors / numpy scalars converted; others dropped)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[str(key)] = bool(value)
            continue
        if hasattr(value, "item") and getattr(value, "size", 1) == 1:
            try:
                value = value.item()
            except (TypeError, ValueError):
                continue
        if isinstance(value, numbers.Number):
            number = float(value)  # type: ignore[arg-type]
            out[str(key)] = int(number) if isinstance(value, numbers.Integral) else number
    return out


def record_location(workspace: Workspace) -> str:
    """Where the workspace's record is, as messages name it: its file, or its server's URL
    (password hidden)."""
    url = WorkspaceSettings.read(workspace.root).record
    return shown(url) if url is not None else str(workspace.registry_path)


class Registry:
    """The record of a workspace: create experiments and trials, record what they report."""

    def __init__(
        self,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        busy_timeout_s: float = BUSY_TIMEOUT_S,
    ) -> None:
        """`busy_timeout_s`: how long a write waits for another process's lock before it fails
        (a trial's process waits briefly and holds its reports back instead, `_outage`)."""
        self.workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        path = self.workspace.registry_path
        self.url = WorkspaceSettings.read(self.workspace.root).record
        try:
            if self.url is not None:
                self._engine = postgres_engine(self.url, busy_timeout_s)
            else:
                self._engine = sqlite_engine(path, busy_timeout_s)
            self._open()
        except (OSError, DBAPIError) as exc:
            if hasattr(self, "_engine"):
                self._engine.dispose()
            if self.url is not None:
                raise record_unreachable(self.workspace.root, self.url, exc) from None
            raise unusable_registry(self.workspace.root, path, exc) from None

    @property
    def location(self) -> str:
        """Where the record is, as messages name it: its file, or its server's URL (the
        setting read when the registry opened, not the file again)."""
        return shown(self.url) if self.url is not None else str(self.workspace.registry_path)

    def _open(self) -> None:
        with self._session() as session:
            Base.metadata.create_all(session.connection())
            version = session.get(Meta, "schema_version")
            if version is None:
                session.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(version.value) > SCHEMA_VERSION:
                raise InvalidArgumentError(
                    f"{self.location} was written by a newer lightning-bridge "
                    f"(registry schema {version.value}, this release reads {SCHEMA_VERSION}); "
                    "upgrade lightning-bridge or choose another --workspace."
                )

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with Session(self._engine, expire_on_commit=False) as session, session.begin():
            yield session

    # ----- experiments and trials -----

    def create_experiment(
        self,
        config: dict[str, Any],
        *,
        name: str = "",
        description: str = "",
        config_path: str = "",
        context_dir: str = "",
        options: dict[str, Any] | None = None,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> int:
        """A new experiment; returns its id (1, 2, ... in the workspace)."""
        row = ExperimentRow(
            name=name,
            description=description,
            config=config,
            config_path=config_path,
            context_dir=context_dir,
            options=dict(options or {}),
            searcher_metric=searcher_metric,
            smaller_is_better=smaller_is_better,
            created_at=time.time(),
        )
        with self._session() as session:
            session.add(row)
            session.flush()
            return int(row.id)

    def create_trial(
        self,
        experiment_id: int,
        *,
        hparams: dict[str, Any],
        seed: int | None,
        source_checkpoint: str | None = None,
    ) -> int:
        """A new trial of an experiment (ACTIVE, not started yet); returns its id, unique in
        the workspace. Its folder is `workspace.trial_dir(experiment_id, id)`."""
        self.experiment(experiment_id)
        with self._session() as session:
            row = TrialRow(
                experiment_id=experiment_id,
                hparams=hparams,
                seed=seed,
                state=TrialState.ACTIVE.value,
                source_checkpoint=source_checkpoint,
            )
            session.add(row)
            session.flush()
            trial_dir = self.workspace.trial_dir(experiment_id, row.id)
            row.run_dir = str(trial_dir)
            row.log_file = str(trial_dir / "trial.log")
            return int(row.id)

    def trial_started(self, trial_id: int, pid: int | None = None, *, new_run: bool = True) -> None:
        """The trial runs (again): ACTIVE, with the process id that runs it. `new_run=False`
        when the process training it takes over from the one that started the run."""
        with self._session() as session:
            row = self._trial_row(session, trial_id)
            row.state = TrialState.ACTIVE.value
            row.start_time = row.start_time or time.time()
            row.end_time = None
            row.message = ""
            row.pid = os.getpid() if pid is None else pid
            row.host = socket.gethostname()
            if new_run:
                row.runs += 1

    def trial_ended(
        self, trial_id: int, state: TrialState, message: str = "", *, if_active: bool = False
    ) -> bool:
        """Record how the trial ended; with `if_active`, only if nothing else recorded it.
        Returns whether the state was written."""
        with self._session() as session:
            row = self._trial_row(session, trial_id)
            if if_active and row.state != TrialState.ACTIVE.value:
                return False
            row.state = state.value
            row.end_time = time.time()
            row.message = message
            return True

    # ----- scheduler jobs -----

    def job_submitted(self, trial_id: int, launcher: str, job_id: str, output: str) -> None:
        """The trial runs as scheduler job `job_id` (replacing the job of an earlier run)."""
        with self._session() as session:
            self._trial_row(session, trial_id)
            row = session.get(JobRow, int(trial_id))
            if row is None:
                row = JobRow(trial_id=int(trial_id))
                session.add(row)
            row.launcher, row.job_id, row.output = launcher, str(job_id), output
            row.state, row.reason, row.restarts = "PENDING", "", 0
            row.updated_at = time.time()

    def job_state(self, trial_id: int, state: str, reason: str = "", restarts: int = 0) -> None:
        """The scheduler's latest word on the trial's job."""
        with self._session() as session:
            row = session.get(JobRow, int(trial_id))
            if row is not None:
                row.state, row.reason, row.restarts = state, reason, restarts
                row.updated_at = time.time()

    def job(self, trial_id: int) -> Job | None:
        with self._session() as session:
            row = session.get(JobRow, int(trial_id))
            return None if row is None else Job.of(row)

    def jobs(self, experiment_id: int) -> list[Job]:
        query = (
            select(JobRow)
            .join(TrialRow, TrialRow.id == JobRow.trial_id)
            .where(TrialRow.experiment_id == int(experiment_id))
            .order_by(JobRow.trial_id)
        )
        with self._session() as session:
            return [Job.of(r) for r in session.scalars(query)]

    # ----- what a trial's script says of itself (the Core API) -----

    def report_run(self, trial_id: int, **fields: Any) -> None:
        """Replace the trial's last `progress`, `status` or `run_metadata` (the fields given)."""
        with self._session() as session:
            self._trial_row(session, trial_id)
            row = session.get(RunReportRow, int(trial_id))
            if row is None:
                row = RunReportRow(trial_id=int(trial_id))
                session.add(row)
            for name, value in fields.items():
                setattr(row, name, value)
            row.updated_at = time.time()

    def run_reports(self, experiment_id: int) -> dict[int, RunReport]:
        """The experiment's trials' last reports, by trial id (a trial that reported none is
        left out)."""
        query = (
            select(RunReportRow)
            .join(TrialRow, TrialRow.id == RunReportRow.trial_id)
            .where(TrialRow.experiment_id == int(experiment_id))
        )
        with self._session() as session:
            return {r.trial_id: RunReport.of(r) for r in session.scalars(query)}

    def run_report(self, trial_id: int) -> RunReport | None:
        with self._session() as session:
            row = session.get(RunReportRow, int(trial_id))
            return None if row is None else RunReport.of(row)

    # ----- metrics -----

    def add_metrics(
        self, trial_id: int, kind: str, batches: int, epochs: int, values: dict[str, Any]
    ) -> None:
        """Record one report: `kind` "training" (a reporting window's averages),
        "validation", or another group a Core API script names (`report_metrics`), at the
        batch count it belongs to."""
        if not _GROUP.fullmatch(kind):
            raise ValueError(
                f"metric group {kind!r}: a group is 1 to 16 letters, digits, '_' or '-' "
                "(training, validation, or a name of your own without '.')"
            )
        with self._session() as session:
            session.add(
                MetricRow(
                    trial_id=trial_id,
                    kind=kind,
                    batches=int(batches),
                    epochs=int(epochs),
                    values=plain_metrics(values),
                    reported_at=time.time(),
                )
            )
            session.execute(
                update(TrialRow)
                .where(TrialRow.id == trial_id, TrialRow.batches_trained < int(batches))
                .values(batches_trained=int(batches), epochs_trained=int(epochs))
            )

    def archive_metrics_after(self, trial_id: int, batches: int) -> None:
        """A trial continues from the checkpoint at `batches`: what it reported after that
        batch will be trained again, so those reports leave the curves (kept, archived)."""
        with self._session() as session:
            session.execute(
                update(MetricRow)
                .where(MetricRow.trial_id == trial_id, MetricRow.batches > int(batches))
                .values(archived=True)
            )
            session.execute(
                update(TrialRow).where(TrialRow.id == trial_id).values(batches_trained=int(batches))
            )

    # ----- checkpoints -----

    def add_checkpoint(
        self,
        uuid: str,
        trial_id: int,
        *,
        batches: int,
        epochs: int,
        location: str,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """A checkpoint on its way to storage (UPLOADING): never listed nor continued from
        until `checkpoint_completed`."""
        with self._session() as session:
            session.add(
                CheckpointRow(
                    uuid=uuid,
                    trial_id=trial_id,
                    state=CheckpointState.UPLOADING.value,
                    batches=int(batches),
                    epochs=int(epochs),
                    metrics=plain_metrics(metrics or {}),
                    location=location,
                    created_at=time.time(),
                )
            )

    def checkpoint_completed(self, uuid: str) -> None:
        self._set_checkpoint_state(uuid, CheckpointState.COMPLETED)

    def checkpoint_deleted(self, uuid: str) -> None:
        self._set_checkpoint_state(uuid, CheckpointState.DELETED)

    def _set_checkpoint_state(self, uuid: str, state: CheckpointState) -> None:
        with self._session() as session:
            row = session.get(CheckpointRow, uuid)
            if row is None:
                raise InvalidArgumentError(f"checkpoint {uuid} is not in {self.workspace.root}")
            row.state = state.value

    # ----- reading -----

    def experiments(self) -> list[Experiment]:
        with self._session() as session:
            rows = session.scalars(select(ExperimentRow).order_by(ExperimentRow.id))
            return [Experiment.of(r) for r in rows]

    def experiment(self, experiment_id: int) -> Experiment:
        with self._session() as session:
            row = session.get(ExperimentRow, int(experiment_id))
            if row is None:
                raise InvalidArgumentError(
                    f"experiment {experiment_id} not found in the workspace "
                    f"{self.workspace.root}; `lightning-bridge experiment list` shows its "
                    "experiments (--workspace DIR for another workspace)."
                )
            return Experiment.of(row)

    def trials(self, experiment_id: int | None = None) -> list[Trial]:
        query = select(TrialRow).order_by(TrialRow.id)
        if experiment_id is not None:
            query = query.where(TrialRow.experiment_id == int(experiment_id))
        with self._session() as session:
            return [Trial.of(r) for r in session.scalars(query)]

    def trial(self, trial_id: int) -> Trial:
        with self._session() as session:
            return Trial.of(self._trial_row(session, trial_id))

    def _trial_row(self, session: Session, trial_id: int) -> TrialRow:
        row = session.get(TrialRow, int(trial_id))
        if row is None:
            raise InvalidArgumentError(
                f"trial {trial_id} not found in the workspace {self.workspace.root}; "
                "`lightning-bridge experiment describe ID` lists an experiment's trials."
            )
        return row

    def metrics(
        self, trial_id: int, kind: str | None = None, *, archived: bool = False
    ) -> list[Metric]:
        """A trial's reports in batch order (archived ones only when asked)."""
        query = select(MetricRow).where(MetricRow.trial_id == int(trial_id))
        if kind is not None:
            query = query.where(MetricRow.kind == kind)
        if not archived:
            query = query.where(MetricRow.archived.is_(False))
        query = query.order_by(MetricRow.batches, MetricRow.id)
        with self._session() as session:
            return [Metric.of(r) for r in session.scalars(query)]

    def checkpoints(
        self,
        *,
        experiment_id: int | None = None,
        trial_id: int | None = None,
        states: Iterable[CheckpointState] = (CheckpointState.COMPLETED,),
    ) -> list[Checkpoint]:
        """Checkpoints (COMPLETED ones unless asked), oldest batch first."""
        query = (
            select(CheckpointRow, TrialRow.experiment_id)
            .join(TrialRow, CheckpointRow.trial_id == TrialRow.id)
            .where(CheckpointRow.state.in_([s.value for s in states]))
            .order_by(TrialRow.experiment_id, CheckpointRow.trial_id, CheckpointRow.batches)
        )
        if experiment_id is not None:
            query = query.where(TrialRow.experiment_id == int(experiment_id))
        if trial_id is not None:
            query = query.where(CheckpointRow.trial_id == int(trial_id))
        with self._session() as session:
            return [Checkpoint.of(row, exp) for row, exp in session.execute(query)]

    def checkpoint(self, uuid: str) -> Checkpoint | None:
        """A checkpoint by its uuid, in any state (None if the workspace never had it)."""
        query = (
            select(CheckpointRow, TrialRow.experiment_id)
            .join(TrialRow, CheckpointRow.trial_id == TrialRow.id)
            .where(CheckpointRow.uuid == uuid)
        )
        with self._session() as session:
            found = session.execute(query).first()
            return None if found is None else Checkpoint.of(found[0], found[1])

    def latest_checkpoint(self, trial_id: int) -> Checkpoint | None:
        """The trial's completed checkpoint with the most batches trained."""
        done = self.checkpoints(trial_id=trial_id)
        return max(done, key=lambda c: (c.batches, c.created_at)) if done else None

    def best_checkpoints(self, experiment_id: int, count: int = 1) -> list[Checkpoint]:
        """The experiment's completed checkpoints with the best searcher metric, best first."""
        experiment = self.experiment(experiment_id)
        metric = experiment.searcher_metric
        scored = [
            c
            for c in self.checkpoints(experiment_id=experiment_id)
            if metric is not None and _finite(c.metrics.get(metric))
        ]
        sign = 1.0 if experiment.smaller_is_better else -1.0
        assert metric is not None or not scored
        scored.sort(key=lambda c: (sign * float(c.metrics[metric or ""]), c.created_at))
        return scored[:count]

    def reconcile(self) -> list[int]:
        """Trials recorded ACTIVE whose process on this machine is gone (killed, crashed)
        become ERROR; returns their ids."""
        host = socket.gethostname()
        gone = []
        with self._session() as session:
            # A scheduler's job between two runs (requeued) has no process: not gone.
            queued = set(
                session.scalars(select(JobRow.trial_id).where(JobRow.state.in_(LIVE_JOB_STATES)))
            )
            rows = session.scalars(
                select(TrialRow).where(TrialRow.state == TrialState.ACTIVE.value)
            )
            for row in rows:
                if row.id in queued:
                    continue
                if row.host == host and row.pid is not None and not pid_alive(row.pid):
                    row.state = TrialState.ERROR.value
                    row.end_time = row.end_time or time.time()
                    row.message = f"its process ({row.pid}) ended without recording an end"
                    gone.append(row.id)
        return gone


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def experiment_state(trials: list[Trial], starts_no_trial: bool = False) -> str:
    """An experiment's state from its trials' (Determined's precedence); one that has none
    yet is ACTIVE, unless its search starts none (an empty grid), which is COMPLETED at once."""
    states = {t.state for t in trials}
    for state in (TrialState.ACTIVE, TrialState.ERROR, TrialState.STOPPED):
        if state.value in states:
            return state.value
    done = states or starts_no_trial
    return TrialState.COMPLETED.value if done else TrialState.ACTIVE.value
