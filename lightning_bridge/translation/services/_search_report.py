"""The trial's side of a hyperparameter search: its rungs, its reports, how it ended.

A trial of a search trains in a process of its own, started from a run description
(`RunDescription`) that names the search: its storage, its name, and the trial as the worker
pulled it. As a Determined cluster's master would, the search then hears from the trial
itself, so the worker that started it has nothing to relay:

- the trial validates at each rung length (ASHA ranks trials there) besides its own periods
  (`rungs`, added to the fit's `Schedule`);
- observing the fit (`FitObserver`), its chief reports the searcher metric of every validation
  to the search (a `SearchDriver` on the same storage) and gets the decision back at once; a
  stop (`stopped`, which the fit's `StopRequest` polls) ends the fit at that boundary (a
  checkpoint written), and the trial ends COMPLETED, as Determined shows a trial its searcher
  stopped;
- when the fit ends, the trial is closed in the search: completed, given back (a signal stopped
  it: it resumes from its checkpoint), failed, or ended by InvalidHP (the searcher replaces it
  where Determined's does). A trial stopped by a signal keeps its search trial instead of
  giving it back when the process that started it will run it again itself (a Slurm job
  being requeued), so that no other job is started for it; so does a trial that failed while
  its job has restarts left (`max_restarts`): only its last failure closes it as failed. The
  starter decides, and says so through the trial's environment (`TrialEnvironment`), which
  every process of the trial inherits, a script entrypoint's too.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_bridge._errors import TrialRuntimeError, is_invalid_hp
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.record._outage import HeldBack
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.search import SearchDriver, TrialSpec
from lightning_bridge.translation._observer import FitObserver, FitOutcome, Progress
from lightning_bridge.translation._values import searcher_value
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import TrialEnvironment

logger = logging.getLogger("lightning_bridge")

# The time metrics the trial counts itself (batches and epochs are also in every validation).
_UNITS = ("batches", "epochs", "records")


def _kept_by_starter(failed: bool) -> str | None:
    """Why the process that started this trial runs it again itself (it keeps its search
    trial), or None; an environment that cannot tell gives the trial back (or fails it)."""
    try:
        return TrialEnvironment.current().keeps_search_trial(failed=failed)
    except Exception as exc:  # noqa: BLE001 - a trial given back (or failed) is never lost
        logger.warning("Could not tell whether the job runs the trial again: %s", exc)
        return None


class SearchReport(FitObserver):
    """One trial of a search, as its own process sees it (see the module docstring)."""

    def __init__(
        self,
        *,
        trial: TrialSpec,
        storage: str,
        name: str,
        metric: str,
        records_per_batch: int = 1,
    ) -> None:
        self.trial = trial
        self._storage = storage
        self._name = name
        self._metric = metric
        self._unit = self.trial.unit or "batches"
        # Records are counted in whole batches of global_batch_size, rounded down as the
        # length of the training is (at least one batch).
        self._records_per_batch = records_per_batch if self._unit == "records" else 1
        self._rung_batches = {
            max(length // self._records_per_batch, 1): length for length in self.trial.rungs
        }
        self._driver: SearchDriver | None = None
        self.stopped = False  # the searcher stopped the trial
        self._stop_now = False
        # Reports held back while the storage is away (a database server restarting); a
        # driver whose connection failed is dropped and opened again for the next try.
        self._reports = HeldBack(f"The search storage of {self._name}", reset=self.close)

    @property
    def driver(self) -> SearchDriver:
        if self._driver is None:
            self._driver = SearchDriver(self._storage, self._name)
        return self._driver

    def close(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()

    # ----- the schedule -----

    def rungs(self) -> tuple[frozenset[int], frozenset[int]]:
        """Where the trial reaches a rung: batch counts, and epoch counts (at an epoch's end).
        A `time_metric` of the trial's own (`samples`, ...) is known only from its validations:
        no extra ones are scheduled."""
        if self._unit not in _UNITS:
            return frozenset(), frozenset()
        if self._unit == "epochs":
            return frozenset(), frozenset(self.trial.rungs)
        if self._unit == "records":
            return frozenset(self._rung_batches), frozenset()
        return frozenset(self.trial.rungs), frozenset()

    # ----- the fit's events (the chief's) -----

    def on_validation(self, progress: Progress, metrics: dict[str, Any]) -> None:
        self.validated(progress.batches, progress.epochs, metrics)

    def on_end(self, outcome: FitOutcome) -> None:
        self.ended(outcome.preempted_by is not None, outcome.stopped_early)

    def on_exception(self, exception: BaseException) -> None:
        self.failed(exception)

    def teardown(self, status: str) -> None:
        self.close()

    def _length(self, batches: int, epochs: int) -> int:
        """How far the trial trained, in the searcher's unit."""
        if self._unit == "epochs":
            return epochs
        if self._unit == "records":
            return max(batches * self._records_per_batch, self._rung_batches.get(batches, 0))
        return batches

    # ----- reports (the chief) -----

    def validated(self, batches: int, epochs: int, metrics: dict[str, Any]) -> bool:
        """Report a validation's searcher metric; returns whether the searcher stops the
        trial."""
        if self._metric not in metrics:
            raise TrialRuntimeError(
                f"the searcher ranks trials by {self._metric!r} (searcher.metric), but "
                f"validation returned {sorted(metrics)}; return that metric or change "
                "searcher.metric."
            )
        value = float(searcher_value(self._metric, metrics[self._metric]))
        length = self._length(batches, epochs)
        if self._unit not in _UNITS:
            # As Determined's searcher: the time is the validation's own `time_metric`.
            if self._unit not in metrics:
                raise TrialRuntimeError(
                    f"the searcher ranks trials at {self._unit!r} (searcher.time_metric), but "
                    f"validation returned {sorted(metrics)}; return that metric or change "
                    "searcher.time_metric."
                )
            length = int(searcher_value(self._unit, metrics[self._unit]))
        return self._report_at(length, value)

    def reported(self, steps_completed: int, metrics: dict[str, Any]) -> bool:
        """Report validation metrics a script reported itself (the Core API's
        `report_validation_metrics`); returns whether the searcher stops the trial. As on
        Determined, the trial's time is the metric named like the searcher's unit (its
        `time_metric`), or the reported `steps_completed` for a length in batches."""
        if self._metric not in metrics:
            raise TrialRuntimeError(
                f"the searcher ranks trials by {self._metric!r} (searcher.metric), but "
                f"report_validation_metrics() reported {sorted(metrics)}; report that metric "
                "or change searcher.metric."
            )
        value = float(searcher_value(self._metric, metrics[self._metric]))
        if self._unit in metrics:
            length = int(searcher_value(self._unit, metrics[self._unit]))
        elif self._unit == "batches":
            length = int(steps_completed)
        else:
            raise TrialRuntimeError(
                f"the searcher ranks trials at {self._unit!r} (searcher.time_metric or the unit "
                f"of searcher.max_length), but report_validation_metrics() reported "
                f"{sorted(metrics)}; report it with the validation metrics."
            )
        return self._report_at(length, value)

    def _report_at(self, length: int, value: float) -> bool:
        self._reports.write(
            f"{self._metric} at {length} {self._unit}", lambda: self._report(length, value)
        )
        stop, self._stop_now = self._stop_now, False
        return stop

    def _report(self, length: int, value: float) -> None:
        decision = self.driver.report(self.trial, length, value)
        if decision.stop and length < max(self.trial.rungs or (length + 1,)):
            logger.info(
                "The searcher stops this trial at %d %s (%s %s)",
                length, self._unit, self._metric, value,
            )  # fmt: skip
        self.stopped = self.stopped or decision.stop
        self._stop_now = self._stop_now or decision.stop

    def ended(self, preempted: bool, stopped_early: bool) -> None:
        """The fit ended: a signal stopped it (`preempted`: given back, to resume from its
        checkpoint, or kept when its job runs it again), it trained to its length or the
        searcher stopped it (completed), or it asked to stop on its own (`stopped_early`: an
        early exit to the searcher)."""
        if preempted and not self.stopped:
            reason = _kept_by_starter(failed=False)
            if reason is not None:
                self._keep(reason)
            else:
                self._reports.write("the trial's end", lambda: self.driver.pause(self.trial))
        else:  # trained to its end, or the searcher stopped it (nothing left to resume)
            early = stopped_early and not self.stopped
            self._reports.write(
                "the trial's end", lambda: self.driver.complete(self.trial, early=early)
            )
        self._reports.flush()

    def _keep(self, reason: str) -> None:
        """The trial's starter runs it again (`TrialEnvironment.keeps_search_trial`): it stays
        this trial's, alive in the search, instead of being given back or failed."""
        logger.info("The trial keeps its search trial: %s", reason)
        self._reports.write("the trial's claim", lambda: self.driver.heartbeat(self.trial))

    def failed(self, exc: BaseException) -> None:
        """The fit raised `exc`: InvalidHP, an interrupt (given back) or an error (failed in
        the search, unless its starter runs it again: `TrialEnvironment`)."""
        invalid_hp = is_invalid_hp(exc)
        if isinstance(exc, KeyboardInterrupt):
            self._reports.write("the trial's end", lambda: self.driver.pause(self.trial))
        elif not invalid_hp and (reason := _kept_by_starter(failed=True)) is not None:
            self._keep(reason)
        else:
            self._reports.write(
                "the trial's end", lambda: self.driver.fail(self.trial, invalid_hp=invalid_hp)
            )
        self._reports.flush()


def search_from_runner(run: RunDescription) -> SearchReport | None:
    """The search of this trial when a search worker started it, else None."""
    if run.search is None:
        return None
    return SearchReport(
        trial=run.search.trial,
        storage=run.search.storage,
        name=run.search.name,
        metric=run.search.metric,
        records_per_batch=int(run.hparams.get("global_batch_size") or 1),
    )


def end_invalid_hp(run: RunDescription, exc: BaseException) -> bool:
    """A trial started by `lightning-bridge` raised InvalidHP: record how it ended (COMPLETED
    with the message, as Determined ends such a trial), tell its search, and return True (the
    process then exits 0); False when the run is not recorded."""
    if run.record is None:
        return False
    message = f"InvalidHP: {getattr(exc, 'msg', None) or exc}"
    logger.info("%s; the trial ends here", message)
    processes = DistributedContext()  # before or after the launcher started the others
    if processes.rank != 0 or processes.local_rank != 0:  # the chief records it
        return True
    with Registry(Workspace(run.record.workspace)) as registry:
        registry.trial_ended(run.record.trial_id, TrialState.COMPLETED, message)
    search = search_from_runner(run)
    if search is not None:
        try:
            search.failed(exc)
        finally:
            search.close()
    return True
