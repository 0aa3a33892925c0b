"""`SearchDriver`: a Determined search run on an Optuna study through ask / tell / report.

Determined's searcher sits on Optuna's extension points (`_extensions`): its sampler gives each
trial its configuration, its pruner stops trials at rungs. Which trials to create, and when, is
Determined's search method (`_methods`), read from the search's trials as the study holds them
(`_attempts`). A trial is created with `Study.enqueue_trial`, pulled with `Study.ask`, reported
to with `Trial.report` and `Trial.should_prune`, and closed with `Study.tell`. Every event runs
under the search's lock (`_storage`, which opens the study), so any number of processes sharing
the storage pull disjoint trials and take the reference's decisions in one order, and a
restarted driver goes on where the last one stopped: pending trials stay pending, rungs keep
their metrics, finished trials never run again.

A trial given back (Ctrl-C, its worker gone) is retried as Optuna's `RetryFailedTrialCallback`
retries a stale trial: its attempt is told FAIL, and the next pull attempts it again as a copy
that keeps its reported metrics. Workers keep their trials alive themselves (`heartbeat`,
`requeue_stale`): Optuna's heartbeat (`RDBStorage(heartbeat_interval=...)`,
`fail_stale_trials`) serves `Study.optimize` on a database only (`Study.ask` warns when it is
on, the journal file has none, and its grace period is the storage's, not each worker's
`--lost-after`), so a beat is a user attr of the trial.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._process import pid_alive
from lightning_bridge.search._attempts import (
    BEAT,
    GIVEN_BACK,
    NOTE,
    PULL,
    STATE,
    TRIAL,
    current_attempts,
    exit_of,
    is_pending,
    record_of,
)
from lightning_bridge.search._methods import Create, Record, method_for
from lightning_bridge.search._space import parse_space
from lightning_bridge.search._storage import SearchStudy, import_optuna
from lightning_bridge.search._views import Decision, SearchSpec, TrialSpec, TrialView


class SearchDriver:
    """Creates, hands out and decides on the trials of one search stored in an Optuna study.

    `SearchDriver(storage, name, spec)` creates the study the first time and checks `spec`
    against it afterwards; `SearchDriver(storage, name)` opens an existing one. `worker` names
    this process in the trials it pulls (default: host and pid).
    """

    def __init__(
        self,
        storage: str,
        name: str,
        spec: SearchSpec | None = None,
        worker: str | None = None,
        job: str | None = None,
    ) -> None:
        self._store = SearchStudy(storage, name, spec)
        from lightning_bridge.search._extensions import (
            DeterminedPruner,
            DeterminedSampler,
            distributions,
        )

        self._optuna = import_optuna()  # imported by the study already: the module
        self._states = self._optuna.trial.TrialState
        self.name = name
        self.spec = self._store.spec
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.job = job  # the scheduler job this worker runs in (its pulls say so)
        space, problems = parse_space(self.spec.hyperparameters)
        assert not problems, "the stored search was validated when created"
        assert self.spec.experiment_seed is not None, "a stored search has its seed"
        self._method = method_for(self.spec.searcher, space)
        self._distributions = distributions(space)
        length = self.spec.searcher.length()
        self._unit = length[0] if length else None
        self._sampler = DeterminedSampler(space, self.spec.experiment_seed)
        self._pruner = DeterminedPruner(self._method, self.spec.searcher.smaller_is_better)
        self._study = self._store.study
        self._study.sampler, self._study.pruner = self._sampler, self._pruner
        with self._store.lock.hold():
            records = self._records()
            self._create(self._method.top_up(records), records)

    # -- the search as the study holds it ----------------------------------------------------
    def _attempts(self) -> dict[int, Any]:
        """The latest attempt of each trial, by request (`current_attempts`), as it is now."""
        return current_attempts(self._study.get_trials(deepcopy=False))

    def _records(self) -> list[Record]:
        return [record_of(a) for a in self._attempts().values()]

    def _create(self, creates: list[Create], records: list[Record]) -> None:
        """Enqueue the trials the search method decided on (once per cause)."""
        causes = {r.cause for r in records}
        for create in creates:
            if create.cause in causes:
                continue
            request = len(records)
            seed, hparams = self._sampler.configuration(request, create.point)
            info = {
                "request": request,
                "bracket": create.bracket,
                "cause": create.cause,
                "seed": seed,
                "hparams": hparams,
            }
            self._study.enqueue_trial({}, user_attrs={TRIAL: info})
            records.append(Record(number=request, bracket=create.bracket, cause=create.cause))
            causes.add(create.cause)

    def _spec(self, attempt: Any) -> TrialSpec:
        attrs = attempt.user_attrs
        info = attrs[TRIAL]
        return TrialSpec(
            number=info["request"],
            hparams=info["hparams"],
            seed=info["seed"],
            bracket=info["bracket"],
            rungs=tuple(self._method.rung_lengths(info["bracket"])),
            unit=self._unit,
            resumed=int(attrs.get(PULL, {}).get("attempt", 0)) > 1,
            notes={k[len(NOTE) :]: v for k, v in attrs.items() if k.startswith(NOTE)},
            attempt=attempt.number,
        )

    def _write_state(
        self,
        attempt: Any,
        record: Record | None,
        exit: str | None = None,
        report: tuple[int, float, bool] | None = None,
    ) -> None:
        """The attempt's searcher state after an event (`record`: as the method left it; None:
        unchanged), with the report taken and how the attempt ended."""
        state: dict[str, Any] = dict(attempt.user_attrs.get(STATE, {}))
        now = time.time()
        if record is not None:
            state["rung"] = record.rung
            state["rungs"] = {str(k): v for k, v in record.rungs.items()}
            state["stopped"] = record.stopped
        state["beat"] = now  # a report is a heartbeat too (see `requeue_stale`)
        state["reports"] = list(state.get("reports", []))
        if report is not None:
            state["reports"].append([*report, now])
        if exit is not None:
            state["exit"] = exit
        self._store.handle(attempt.number).set_user_attr(STATE, state)

    def _find(self, trial: TrialSpec | int) -> tuple[list[Record], Record, Any]:
        """The records, the trial's record and its latest attempt."""
        number = trial if isinstance(trial, int) else trial.number
        attempts = self._attempts()
        if number not in attempts:
            raise InvalidArgumentError(f"trial {number} is not part of search {self.name!r}")
        records = [record_of(a) for a in attempts.values()]
        return records, records[number], attempts[number]

    def _held(self, trial: TrialSpec | int, attempt: Any) -> bool:
        """Whether `trial` is running, and (for a TrialSpec from a pull) still under that
        pull: the caller may report, close it or give it back."""
        if attempt.state != self._states.RUNNING:
            return False
        return not isinstance(trial, TrialSpec) or trial.attempt in (None, attempt.number)

    def _give_back(self, attempt: Any) -> None:
        """End the attempt as given back: the trial is pending again (see `next_trial`)."""
        self._write_state(attempt, None, exit=GIVEN_BACK)
        self._study.tell(attempt.number, state=self._states.FAIL)

    def _close(self, attempt: Any, record: Record, exit: str, pruned: bool = False) -> None:
        """Tell the attempt's end: PRUNED (stopped below the top rung), COMPLETE with its last
        metric, or FAIL (an error, InvalidHP, or no metric to complete with, as Optuna's
        `tell` has it)."""
        self._write_state(attempt, record, exit=exit)
        values = attempt.intermediate_values
        last = values[max(values)] if values else math.nan
        if pruned:
            self._study.tell(attempt.number, state=self._states.PRUNED)
        elif exit == "completed" and not math.isnan(last):
            self._study.tell(attempt.number, last)
        else:
            self._study.tell(attempt.number, state=self._states.FAIL)

    # -- the API a runner uses ---------------------------------------------------------------
    def next_trial(self) -> TrialSpec | None:
        """The oldest pending trial, now running in this worker; None when none is pending
        (the search may still create more when running trials report: see `is_finished`)."""
        with self._store.lock.hold():
            pending = [a for a in self._attempts().values() if is_pending(a)]
            if not pending:
                return None
            chosen = pending[0]
            pull = {
                "worker": self.worker,
                "since": time.time(),
                "attempt": int(chosen.user_attrs.get(PULL, {}).get("attempt", 0)) + 1,
            }
            if self.job is not None:
                pull["job"] = self.job
            request = chosen.user_attrs[TRIAL]["request"]
            if chosen.state == self._states.WAITING:
                # Trials are enqueued in request order, so `ask` pops this one.
                trial = self._store.ask(self._distributions)
                if trial.user_attrs.get(TRIAL, {}).get("request") != request:
                    raise InvalidArgumentError(
                        f"the study {self.name!r} holds waiting trials lightning-bridge did "
                        "not make; give the search a study of its own"
                    )
                trial.set_user_attr(PULL, pull)
                return self._spec(trial)
            self._retry(chosen, pull)
            return self._spec(self._attempts()[request])

    def _retry(self, previous: Any, pull: dict[str, Any]) -> None:
        """Attempt a given-back trial again: a running copy of its last attempt, with its
        parameters, attrs and reported metrics (Optuna's `RetryFailedTrialCallback` makes the
        same copy, waiting; this one is pulled at once, so it runs before newer trials)."""
        attrs = {k: v for k, v in previous.user_attrs.items() if k != BEAT}
        state = dict(attrs.get(STATE, {}))
        state.pop("exit", None)
        attrs[STATE], attrs[PULL] = state, pull
        self._study.add_trial(
            self._optuna.trial.create_trial(
                state=self._states.RUNNING,
                params=previous.params,
                distributions=previous.distributions,
                user_attrs=attrs,
                intermediate_values=previous.intermediate_values,
            )
        )

    def report(self, trial: TrialSpec | int, length: int, metric: float) -> Decision:
        """`trial` validated after `length` units of training with searcher metric `metric`."""
        with self._store.lock.hold():
            _, _, attempt = self._find(trial)
            if not self._held(trial, attempt):
                return Decision(stop=True)  # closed, or given back: not this run's to train
            handle = self._store.handle(attempt.number)
            if int(length) not in attempt.intermediate_values:
                handle.report(float(metric), int(length))
            self._pruner.outcome = None
            stop = bool(handle.should_prune())
            assert self._pruner.outcome is not None, "the pruner decided on the report"
            records, record, creates = self._pruner.outcome
            self._create(creates, records)
            report = (int(length), float(metric), stop)
            self._write_state(attempt, record, report=report)
        rungs = self._method.rung_lengths(record.bracket)
        upcoming = [r for r in rungs if r > length]
        return Decision(stop=stop, next_rung=None if stop or not upcoming else upcoming[0])

    def complete(self, trial: TrialSpec | int, early: bool = False) -> None:
        """`trial` finished training (its max_length, or a stop) and closed normally;
        `early`: it stopped on its own before either (the trial asked to stop), which the
        searcher takes as an early exit, as Determined's does."""
        with self._store.lock.hold():
            records, record, attempt = self._find(trial)
            if not self._held(trial, attempt):
                return
            record.open = False
            if early and not record.stopped:
                creates = self._method.on_early_exit(records, record, False)
            else:
                creates = self._method.on_close(records, record)
            self._create(creates, records)
            top = len(self._method.rung_lengths(record.bracket)) - 1
            pruned = record.stopped and record.rung < top
            self._close(attempt, record, "stopped" if pruned else "completed", pruned)

    def fail(self, trial: TrialSpec | int, invalid_hp: bool = False) -> None:
        """`trial` exited early: an error, or InvalidHP (`invalid_hp`), which the searcher
        replaces where Determined's does."""
        with self._store.lock.hold():
            records, record, attempt = self._find(trial)
            if not self._held(trial, attempt):
                return
            record.open = False
            self._create(self._method.on_early_exit(records, record, invalid_hp), records)
            self._close(attempt, record, "invalid_hp" if invalid_hp else "errored")

    def pause(self, trial: TrialSpec | int) -> None:
        """Give `trial` back: pending again, to resume from its checkpoint (Ctrl-C, a worker
        shutting down)."""
        with self._store.lock.hold():
            _, _, attempt = self._find(trial)
            if self._held(trial, attempt):
                self._give_back(attempt)

    def heartbeat(self, trial: TrialSpec | int) -> None:
        """`trial` is alive (see `requeue_stale`)."""
        with self._store.lock.hold():
            _, _, attempt = self._find(trial)
            if self._held(trial, attempt):  # a closed trial's attributes cannot change
                self._store.handle(attempt.number).set_user_attr(BEAT, time.time())

    def lost(self, trial: TrialSpec | int, give_back: bool) -> bool:
        """The process that ran `trial` is gone. If the trial is still running (that process
        neither closed it nor gave it back), give it back (`give_back`: the run was stopped)
        or close it as errored. Returns whether it was still running."""
        with self._store.lock.hold():
            records, record, attempt = self._find(trial)
            if not self._held(trial, attempt):
                return False
            if give_back:
                self._give_back(attempt)
                return True
            record.open = False
            self._create(self._method.on_early_exit(records, record, False), records)
            self._close(attempt, record, "errored")
        return True

    def note(self, trial: TrialSpec | int, key: str, value: Any) -> None:
        """Keep `value` (JSON) on `trial` (running) under `key`; `TrialSpec.notes` has it
        next time."""
        with self._store.lock.hold():
            _, _, attempt = self._find(trial)
            self._store.handle(attempt.number).set_user_attr(NOTE + key, value)

    def set_search_note(self, key: str, value: Any) -> None:
        """Keep `value` (JSON) on the search under `key`: what its workers need to know."""
        self._study.set_user_attr(NOTE + key, value)

    def search_note(self, key: str) -> Any:
        """What `set_search_note` kept under `key` (None when nothing was)."""
        return self._study.user_attrs.get(NOTE + key)

    def _give_back_lost(self, lost: Callable[[Any], bool]) -> list[int]:
        """Give back the running trials `lost` says are lost; returns their numbers."""
        numbers = []
        with self._store.lock.hold():
            for attempt in self._attempts().values():
                if attempt.state == self._states.RUNNING and lost(attempt.user_attrs):
                    self._give_back(attempt)
                    numbers.append(attempt.user_attrs[TRIAL]["request"])
        return numbers

    def requeue_orphans(self) -> list[int]:
        """Give back running trials pulled by a process of this host that is gone (a worker
        killed before it could give its trials back); returns their numbers."""
        host = socket.gethostname()

        def orphan(attrs: dict[str, Any]) -> bool:
            name, _, pid = str(attrs.get(PULL, {}).get("worker", "")).rpartition(":")
            return name == host and pid.isdigit() and not pid_alive(int(pid))

        return self._give_back_lost(orphan)

    def requeue_job(self, job: str) -> list[int]:
        """Give back running trials pulled by a worker in scheduler job `job` (`job=` of that
        worker's driver), which ended with them (a Slurm worker job cancelled, failed or
        lost); returns their numbers."""
        return self._give_back_lost(lambda attrs: attrs.get(PULL, {}).get("job") == job)

    def requeue_stale(self, timeout_s: float) -> list[int]:
        """Give back running trials not heard of (pulled, reported, `heartbeat`) for more than
        `timeout_s` (their worker died); returns their numbers."""
        now = time.time()

        def stale(attrs: dict[str, Any]) -> bool:
            beats = (
                attrs.get(BEAT, 0.0),
                attrs.get(STATE, {}).get("beat", 0.0),
                attrs.get(PULL, {}).get("since", 0.0),
            )
            return now - max(beats) > timeout_s

        return self._give_back_lost(stale)

    def is_finished(self) -> bool:
        """Whether every trial of the search has closed and none is left to create."""
        with self._store.lock.hold():
            records = self._records()
        return not any(r.open for r in records)

    def trials(self) -> list[TrialView]:
        """Every trial of the search in creation order."""
        names = {self._states.WAITING: "waiting", self._states.RUNNING: "running"}
        with self._store.lock.hold():
            attempts = self._attempts()
        views = []
        for attempt in attempts.values():
            info, record = attempt.user_attrs[TRIAL], record_of(attempt)
            state = "waiting" if is_pending(attempt) else names.get(attempt.state)
            views.append(
                TrialView(
                    number=record.number,
                    state=state or exit_of(attempt) or "",
                    hparams=info["hparams"],
                    seed=info["seed"],
                    bracket=record.bracket,
                    rungs=record.rungs,
                    metrics=dict(attempt.intermediate_values),
                    reports=[
                        (int(r[0]), float(r[1]), bool(r[2]), float(r[3]))
                        for r in attempt.user_attrs.get(STATE, {}).get("reports", [])
                    ],
                )
            )
        return views

    def close(self) -> None:
        """Release the storage's lock handle (the storage itself needs no closing)."""
        self._store.close()
