"""`CoreRun`: what a Core API script's contexts report to when `lightning-bridge run` started it.

Under the command, a script's `core_context` is a thin face over the same services a
`Trainer.fit` reports to (DESIGN.md, "Three of Determined's APIs, one set of services"): the run
record (`RunRecord`: metrics, checkpoints moved into `checkpoint_storage`, how the trial ended),
a search's report (`SearchReport`: the searcher metric of each validation, the searcher's
decision back), the MLflow mirror, Lightning's loggers (TensorBoard) and the `StopRequest`
(SIGTERM / SIGINT: `experiment pause`; on Slurm, the signal before a cancel, a requeue or the
time limit). The chief process reports; every process shares the stop decision.
"""

from __future__ import annotations

import logging
import pathlib
import signal
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import InvalidHP, is_invalid_hp
from lightning_bridge.checkpoint._retention import CheckpointRetention
from lightning_bridge.checkpoint._storage_backend import CheckpointStorage
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.translation._observer import FitOutcome, Progress
from lightning_bridge.translation._values import searcher_value
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._stop_request import StopRequest

if TYPE_CHECKING:
    from lightning_bridge.record._registry import Registry
    from lightning_bridge.translation.services._mlflow_mirror import MlflowMirror
    from lightning_bridge.translation.services._run_record import RunRecord
    from lightning_bridge.translation.services._search_report import SearchReport

logger = logging.getLogger("lightning_bridge.core")


class CoreRun:
    """One trial's services, as a Core API script under `lightning-bridge run` reaches them."""

    def __init__(self, run: RunDescription, dist: DistributedContext, auto_tensorboard: bool):
        from lightning_bridge.translation.services._mlflow_mirror import mirror_from_runner
        from lightning_bridge.translation.services._run_record import record_from_runner
        from lightning_bridge.translation.services._search_report import search_from_runner

        self.run = run
        self.dist = dist
        self.is_chief = dist.rank == 0
        self.values = ConfigValues.of(run.config)
        run_dir = run.run_dir or pathlib.Path.cwd()
        self.run_dir = run_dir
        self.checkpoint_dir = run.checkpoint_dir or run_dir / "checkpoints"
        self.tensorboard_dir = run_dir / "tensorboard"
        self.storage: CheckpointStorage = storage_from_config(
            self.values.checkpoint_storage, self.checkpoint_dir
        )
        self.record: RunRecord | None = None
        self.search: SearchReport | None = None
        self.mirror: MlflowMirror | None = None
        self.retention: CheckpointRetention | None = None
        self.loggers: list[Any] = []
        if self.is_chief:
            self.record = record_from_runner(run, self.values, self.checkpoint_dir)
            self.search = None if run.test_mode else search_from_runner(run)
            self.mirror = mirror_from_runner(run)
            self.retention = CheckpointRetention.from_section(
                self.values.checkpoint_storage,
                smaller_is_better=self.values.smaller_is_better,
                remove=self.record.remove if self.record is not None else None,
            )
            if self.retention is not None and self.record is not None:
                self.record.track_kept(self.retention)
            if auto_tensorboard:
                from lightning_bridge.translation.services._logger_reports import run_loggers

                self.loggers = run_loggers(run_dir, self.tensorboard_dir, lightning=False)
        search = self.search
        self.stop = StopRequest(
            dist, searcher_asks=(lambda: search.stopped) if search is not None else None
        )
        self.last_validation: tuple[int, dict[str, Any]] | None = None
        # What the script reported with `report_early_exit` (EarlyExitReason's value).
        self.early_exit_reason: str | None = None
        self._closed = False
        self._metadata: dict[str, Any] | None = None  # as this process last set it

    # ----- the script's life -----

    def start(self) -> None:
        """Catch the stop signals and record the trial's start (the chief)."""
        self.stop.install()
        if self.record is not None:
            self.record.on_fit_start()
        if self.mirror is not None:
            self.mirror.on_fit_start()

    def signalled(self) -> bool:
        """Whether this process got a stop signal, or (the chief) the searcher stopped it."""
        return bool(self.stop.received) or (self.search is not None and self.search.stopped)

    def close(self, exc: BaseException | None) -> None:
        """The script left `with core.init()`: record how the trial ended (the chief)."""
        if self._closed:
            return
        self._closed = True
        self.stop.restore()
        if not self.is_chief:
            return
        status = "failed" if exc is not None else "success"
        if exc is None and self.early_exit_reason == "EXITED_REASON_INVALID_HP":
            exc = InvalidHP("reported with report_early_exit(EarlyExitReason.INVALID_HP)")
        try:
            if exc is None or isinstance(exc, SystemExit) and not exc.code:
                stopped_by = None
                if self.stop.received and not (self.search is not None and self.search.stopped):
                    stopped_by = signal.Signals(self.stop.received).name
                outcome = FitOutcome(
                    preempted_by=stopped_by, stopped_early=self.early_exit_reason is not None
                )
                for observer in (self.record, self.search, self.mirror):
                    if observer is not None:
                        observer.on_end(outcome)
            elif is_invalid_hp(exc):
                # As a trial class's InvalidHP ends: COMPLETED with its message, the search
                # told (it replaces the trial where Determined's searcher does).
                from lightning_bridge.translation.services._search_report import end_invalid_hp

                end_invalid_hp(self.run, exc)
            elif self.search is not None:
                self.search.on_exception(exc)
        finally:
            for fit_logger in self.loggers:
                fit_logger.finalize(status)
            for observer in (self.record, self.search, self.mirror):
                if observer is not None:
                    observer.teardown(status)

    # ----- reports (the chief) -----

    def training(
        self, steps: int, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]] | None
    ) -> None:
        from lightning_bridge.translation.services._logger_reports import log_training

        progress = Progress(int(steps), 0)
        if self.record is not None:
            self.record.training(progress.batches, 0, metrics)
        if self.loggers:
            log_training(self.loggers, metrics, list(batch_metrics or []), progress.batches)
        if self.mirror is not None:
            self.mirror.on_training_report(progress, metrics, list(batch_metrics or []))

    def validation(self, steps: int, metrics: dict[str, Any]) -> None:
        from lightning_bridge.translation.services._logger_reports import log_validation

        progress = Progress(int(steps), 0)
        self.last_validation = (progress.batches, dict(metrics))
        if self.record is not None:
            self.record.validation(progress.batches, 0, metrics)
        if self.search is not None:
            self.search.reported(progress.batches, metrics)
        if self.loggers:
            log_validation(self.loggers, metrics, progress.batches)
        if self.mirror is not None:
            self.mirror.on_validation(progress, metrics)

    def other(self, group: str, steps: int, metrics: dict[str, Any]) -> None:
        if self.record is not None:
            self.record.group(group, int(steps), metrics)
        if self.mirror is not None:
            self.mirror.on_training_report(Progress(int(steps), 0), metrics, [])

    def checkpoint(self, path: pathlib.Path, storage_id: str, metadata: dict[str, Any]) -> None:
        """A complete checkpoint folder at `path` (its metadata written): into storage under
        `storage_id`, recorded, and retention applied (the chief)."""
        steps = metadata.get("steps_completed")
        batches = int(steps) if isinstance(steps, (int, float)) else 0
        metrics = None
        if self.last_validation is not None and self.last_validation[0] == batches:
            metrics = self.last_validation[1]
        if self.record is None:
            self.storage.publish(path, storage_id)
            return
        self.record.checkpoint(path, storage_id, batches, 0, metrics)
        if self.retention is not None:
            metric = self.values.searcher_metric
            value = None
            if metrics is not None and metric is not None and metric in metrics:
                value = float(searcher_value(metric, metrics[metric]))
            self.retention.record(self.checkpoint_dir / storage_id, value)
        if self.mirror is not None:
            from lightning_bridge.translation._observer import SavedCheckpoint

            self.mirror.on_checkpoint(
                SavedCheckpoint(self.checkpoint_dir / storage_id, Progress(batches, 0), metrics)
            )

    def report_run(self, **fields: Any) -> None:
        """The script's progress, status line or run metadata, into the trial's record: the
        chief's held-back writes; another process (`set_metadata` may come from any rank)
        writes at once."""
        if "run_metadata" in fields:
            self._metadata = fields["run_metadata"]
        if self.record is not None:
            self.record.run_report(**fields)
        elif self.run.record is not None:
            with self._registry() as registry:
                registry.report_run(self.run.record.trial_id, **fields)

    def run_metadata(self) -> dict[str, Any] | None:
        """The trial's run metadata as last set: by this process (its write may be held
        back), else in the record (an earlier run of the trial, another process)."""
        if self._metadata is not None:
            return self._metadata
        if self.run.record is None:
            return None
        with self._registry() as registry:
            report = registry.run_report(self.run.record.trial_id)
        return None if report is None else report.run_metadata

    def _registry(self) -> Registry:
        from lightning_bridge.record._registry import Registry
        from lightning_bridge.record._workspace import Workspace

        assert self.run.record is not None
        return Registry(Workspace(self.run.record.workspace))

    def best_validation(self) -> float | None:
        """The experiment's best searcher metric reported so far (None before one)."""
        metric = self.values.searcher_metric
        if self.run.record is None or metric is None:
            return None
        with self._registry() as registry:
            values = [
                float(m.values[metric])
                for trial in registry.trials(self.run.record.experiment_id)
                for m in registry.metrics(trial.id, "validation")
                if isinstance(m.values.get(metric), (int, float))
            ]
        if not values:
            return None
        return min(values) if self.values.smaller_is_better else max(values)
