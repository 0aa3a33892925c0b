"""What a fit started by `lightning-bridge run` does beside training: its `RunRecord`.

The runner names the trial's record in the run it describes (`RunDescription`); the record
observes the fit (`FitObserver`) on its chief process: it records every training report and
validation in the workspace's registry, moves each durable checkpoint from the trial's folder
into its `checkpoint_storage` (uploading it to an object store) and marks it complete, deletes
from there what retention drops, and records how the fit ended. So metrics and checkpoints are
recorded by the trial's own process, whether it is a trial class run by the command or a
training script it launched.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from typing import Any

from lightning_bridge._process import seconds_running
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._storage_backend import CheckpointStorage
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.checkpoint._writable import directory_bytes, write_failure
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.record._outage import HeldBack
from lightning_bridge.record._registry import Registry, record_location
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation._observer import (
    FitObserver,
    FitOutcome,
    Progress,
    SavedCheckpoint,
)
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge")

# Counters the bridge adds to a training window's averages; they are the report's position.
_POSITION = ("batches", "epochs")
# How long a write of the trial waits for a lock another process holds on the record before
# it is held back (training goes on meanwhile).
WRITE_WAIT_S = 0.5


class RunRecord(FitObserver):
    """The registry and storage side of one trial's fit (the chief process writes)."""

    def __init__(
        self,
        *,
        trial_id: int,
        experiment_id: int,
        workspace: Workspace,
        storage: CheckpointStorage,
        checkpoint_dir: pathlib.Path,
        searcher_metric: str | None = None,
        continue_command: str | None = None,
    ) -> None:
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self.continue_command = continue_command
        self.storage = storage
        self._workspace = workspace
        self._registry: Registry | None = None
        # The record's writes, held back while the database is away (a lock held elsewhere).
        self._writes = HeldBack(f"The record {record_location(self._workspace)}")
        self._checkpoint_dir = checkpoint_dir
        self._metric = searcher_metric

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry(self._workspace, busy_timeout_s=WRITE_WAIT_S)
        return self._registry

    def _write(self, what: str, op: Callable[[Registry], Any]) -> None:
        self._writes.write(what, lambda: op(self.registry))

    def close(self) -> None:
        self._writes.flush()
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    # ----- the fit's events -----

    def on_fit_start(self) -> None:
        running = seconds_running()
        if running is not None:
            logger.info("Start-up: %.2f s from the trial process's start to training", running)
        self.started()

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        self.training(progress.batches, progress.epochs, metrics)

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        # Recorded with the position, as Determined reports it (unless the trial's own).
        values = {**metrics}
        values.setdefault("batches", progress.batches)
        values.setdefault("epochs", progress.epochs)
        self.validation(progress.batches, progress.epochs, values)

    def on_checkpoint(self, checkpoint: SavedCheckpoint) -> None:
        path, progress = checkpoint.path, checkpoint.progress
        try:
            self.checkpoint(path, path.name, progress.batches, progress.epochs, checkpoint.metrics)
        except OSError as exc:  # moving it into checkpoint storage (a full disk there)
            where = pathlib.Path(self.storage.root)
            raise write_failure(where, exc, directory_bytes(path)) from None

    def on_end(self, outcome: FitOutcome) -> None:
        self.ended(outcome.preempted_by)

    def teardown(self, status: str) -> None:
        self.close()

    # ----- reports -----

    def started(self) -> None:
        pid = os.getpid()
        self._write(
            "the trial's start", lambda r: r.trial_started(self.trial_id, pid, new_run=False)
        )

    def training(self, batches: int, epochs: int, metrics: dict[str, Any]) -> None:
        values = {k: v for k, v in metrics.items() if k not in _POSITION}
        if values:
            self._write(
                f"training metrics at batch {batches}",
                lambda r: r.add_metrics(self.trial_id, "training", batches, epochs, values),
            )

    def validation(self, batches: int, epochs: int, metrics: dict[str, Any]) -> None:
        self._write(
            f"validation metrics at batch {batches}",
            lambda r: r.add_metrics(self.trial_id, "validation", batches, epochs, metrics),
        )

    def group(self, group: str, batches: int, metrics: dict[str, Any]) -> None:
        """Metrics of a group of the script's own (the Core API's `report_metrics`)."""
        self._write(
            f"{group} metrics at batch {batches}",
            lambda r: r.add_metrics(self.trial_id, group, batches, 0, metrics),
        )

    def run_report(self, **fields: Any) -> None:
        """The script's own word on the trial (progress, status line, run metadata)."""
        self._write(
            f"the trial's {', '.join(fields)}",
            lambda r: r.report_run(self.trial_id, **fields),
        )

    def ended(self, stopped_by: str | None) -> None:
        """A signal stopped the fit (STOPPED); otherwise the trial trained to its end (or
        asked to stop early), which Determined records as COMPLETED."""
        if stopped_by is not None:
            message = f"stopped by {stopped_by}"
            self._write(
                "the trial's end",
                lambda r: r.trial_ended(self.trial_id, TrialState.STOPPED, message),
            )
        else:
            self._write(
                "the trial's end", lambda r: r.trial_ended(self.trial_id, TrialState.COMPLETED)
            )
        self._writes.flush()

    # ----- checkpoints -----

    def checkpoint(
        self,
        path: pathlib.Path,
        uuid: str,
        batches: int,
        epochs: int,
        metrics: dict[str, Any] | None,
    ) -> None:
        """Move a checkpoint just written to `path` into storage; only then is it complete.
        While the record is away the move waits too (in order, behind the record's writes):
        a checkpoint is never in storage without its record."""
        where = self.storage.url(uuid)
        self._write(
            f"checkpoint {uuid}",
            lambda r: r.add_checkpoint(
                uuid, self.trial_id, batches=batches, epochs=epochs, location=where,
                metrics=metrics,
            ),
        )  # fmt: skip
        self._writes.write(
            f"the move of checkpoint {uuid} into storage", lambda: self._publish(path, uuid)
        )
        self._write(f"checkpoint {uuid} complete", lambda r: r.checkpoint_completed(uuid))

    def _publish(self, path: pathlib.Path, uuid: str) -> None:
        location = self.storage.publish(path, uuid)
        if location != str(path):
            logger.info("Checkpoint %s stored in %s", uuid, location)

    def remove(self, path: pathlib.Path) -> None:
        """Delete a checkpoint retention drops: from storage and the registry."""
        uuid = path.name
        self._writes.write(f"the deletion of checkpoint {uuid}", lambda: self.storage.delete(uuid))
        self._write(f"checkpoint {uuid} deleted", lambda r: r.checkpoint_deleted(uuid))

    def track_kept(self, retention: CheckpointRetention) -> None:
        """Make `retention` aware of the checkpoints earlier runs of this trial kept."""
        for kept in self.registry.checkpoints(trial_id=self.trial_id):
            value = kept.metrics.get(self._metric) if self._metric else None
            metric = float(value) if isinstance(value, (int, float)) else None
            retention.track(self._checkpoint_dir / kept.uuid, metric)


def record_from_runner(
    run: RunDescription, config: ConfigValues, checkpoint_dir: pathlib.Path
) -> RunRecord | None:
    """The record of this fit the runner described, or None when it is not recorded."""
    if run.record is None:
        return None
    return RunRecord(
        trial_id=run.record.trial_id,
        experiment_id=run.record.experiment_id,
        workspace=Workspace(run.record.workspace),
        storage=storage_from_config(config.checkpoint_storage, checkpoint_dir),
        checkpoint_dir=checkpoint_dir,
        searcher_metric=config.searcher_metric,
        continue_command=run.continue_command,
    )
