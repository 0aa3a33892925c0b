"""`MlflowMirror`: the trial's record mirrored into MLflow while it trains, beside the fit.

An observer of the fit (`FitObserver`) on the chief process, after the run record: at each
report, validation and checkpoint it asks a background thread to send what the record has and
MLflow lacks (`tracking.Mirror`), so the loop never waits for the network. A tracking server
that does not answer is tried a bounded number of times (each request fails within seconds),
then the mirror stops trying and warns once; nothing is lost, since the record keeps
everything and `lightning-bridge experiment sync ID` sends it later. At the end of the fit it
waits a bounded time for the last send.

Why not Lightning's `MLFlowLogger` for the metrics: it logs from the training loop itself, so an
unreachable server stalls the step (MLflow's client retries for minutes) or raises in it, and it
keeps no account of what the server has, so what it missed cannot be sent later without
duplicates. Sending from the record gives both with one path: the same `Mirror` runs here, at
the end of the run and in `experiment sync`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation._observer import (
    FitObserver,
    FitOutcome,
    Progress,
    SavedCheckpoint,
)
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge")

# Failed sends in a row before the mirror gives up for this fit, and how long the fit's end
# waits for the last send.
MAX_FAILURES = 3
END_WAIT_S = 20.0


class MlflowMirror(FitObserver):
    """One trial's run in MLflow, kept up to date from the record (see the module docstring)."""

    def __init__(
        self, *, workspace: Workspace, experiment_id: int, trial_id: int, uri: str
    ) -> None:
        self.workspace = workspace
        self.experiment_id = experiment_id
        self.trial_id = trial_id
        self.uri = uri
        self.tags = (
            {"lightning_bridge.slurm_job_id": os.environ["SLURM_JOB_ID"]}
            if os.environ.get("SLURM_JOB_ID")
            else {}
        )
        self.failures = 0
        self.error: BaseException | None = None
        self._wanted = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._thread: threading.Thread | None = None

    # ----- the fit's events -----

    def on_fit_start(self) -> None:
        self._poke()

    def on_training_report(
        self, progress: Progress, metrics: dict[str, Any], batch_metrics: list[dict[str, Any]]
    ) -> None:
        self._poke()

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        self._poke()

    def on_checkpoint(self, checkpoint: SavedCheckpoint) -> None:
        self._poke()

    def on_end(self, outcome: FitOutcome) -> None:
        self._poke()

    def teardown(self, status: str) -> None:
        self.close(END_WAIT_S)

    # ----- the sender -----

    @property
    def gave_up(self) -> bool:
        return self.failures >= MAX_FAILURES

    def _poke(self) -> None:
        if self.gave_up or self._closing:
            return
        self._idle.clear()
        self._wanted.set()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="lightning-bridge-mlflow", daemon=True
            )
            self._thread.start()

    def _serve(self) -> None:
        from lightning_bridge.record._registry import Registry
        from lightning_bridge.tracking._mirror import Mirror, bounded_requests

        bounded_requests()
        registry: Registry | None = None
        mirror: Mirror | None = None
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self.gave_up:
                    break
                try:
                    if mirror is None:
                        registry = Registry(self.workspace)
                        mirror = Mirror(registry, self.uri)
                    mirror.sync_trial(self.trial_id, self.tags)
                    self.failures = 0
                except Exception as exc:  # noqa: BLE001 - a mirror never fails the trial
                    self.failures += 1
                    self.error = exc
                    if self.gave_up:
                        logger.warning(
                            "MLflow at %s did not take the record of trial %d (%s); training "
                            "goes on, the record keeps everything: send it later with "
                            "`lightning-bridge experiment sync %d`",
                            self.uri,
                            self.trial_id,
                            _short(exc),
                            self.experiment_id,
                        )
                        break
                    self._wanted.set()  # try again (the next request waits its own timeout)
                if not self._wanted.is_set():
                    self._idle.set()
                    if self._closing:
                        break
        finally:
            self._idle.set()
            if registry is not None:
                registry.close()

    def close(self, wait_s: float) -> None:
        """Send the last state (waiting at most `wait_s`), then stop the sender."""
        if self._thread is None:
            return
        self._poke()
        self._closing = True
        finished = self._idle.wait(wait_s)
        self._wanted.set()
        if not finished and not self.gave_up:
            logger.warning(
                "MLflow at %s is slow; the rest of trial %d's record is sent by "
                "`lightning-bridge experiment sync %d`",
                self.uri,
                self.trial_id,
                self.experiment_id,
            )


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def mirror_from_runner(run: RunDescription) -> MlflowMirror | None:
    """The MLflow mirror of the run the runner described, or None when nothing is mirrored."""
    if run.record is None:
        return None
    from lightning_bridge.tracking._settings import tracking_uri

    workspace = Workspace(run.record.workspace)
    try:
        uri = tracking_uri(workspace.root, run.options.get("tracking_uri"))
    except Exception as exc:  # noqa: BLE001 - a bad setting is reported, training goes on
        logger.warning("No MLflow mirror: %s", exc)
        return None
    if uri is None:
        return None
    return MlflowMirror(
        workspace=workspace,
        experiment_id=run.record.experiment_id,
        trial_id=run.record.trial_id,
        uri=uri,
    )
