"""`SearchDriver`: a Determined search kept in an Optuna study.

Each trial of the search is an Optuna trial: created WAITING with its hyperparameters (Optuna
`params` for the dashboard; the whole values, trial seed, bracket and cause in system attrs),
RUNNING once a worker pulls it, then COMPLETE, PRUNED (stopped at a rung below the top) or
FAIL (an error or InvalidHP). Reported metrics are its intermediate values, keyed by length.
The search method's state is read back from the trials at every event (`_methods`), under the
storage's lock (`_storage`), so any number of processes sharing the storage pull disjoint
trials and take the reference's decisions in one order, and a restarted driver goes on where
the last one stopped: pending trials stay pending, rungs keep their metrics, finished trials
never run again.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._process import pid_alive
from lightning_bridge.search._methods import Create, Record, method_for, signed
from lightning_bridge.search._optuna_view import params_and_distributions
from lightning_bridge.search._space import parse_space, trial_draw
from lightning_bridge.search._storage import import_optuna, open_storage
from lightning_bridge.search._study import open_study
from lightning_bridge.search._views import Decision, SearchSpec, TrialSpec, TrialView

_TRIAL = "lightning_bridge:trial"  # trial, fixed at creation: request, bracket, cause, values
_STATE = "lightning_bridge:state"  # trial, one write per event: rung, rungs, stopped, exit
_WORKER = "lightning_bridge:worker"  # trial: who pulled it and when
_HEARTBEAT = "lightning_bridge:heartbeat"
_RESUME = "lightning_bridge:resume"
_NOTE = "lightning_bridge:note:"  # trial: what workers note for each other (`note`)


class SearchDriver:
    """Creates, hands out and decides on the trials of one search stored in an Optuna study.

    `SearchDriver(storage, name, spec)` creates the study the first time and checks `spec`
    against it afterwards; `SearchDriver(storage, name)` opens an existing one. `worker` names
    this process in the trials it pulls (default: host and pid).
    """

    def __init__(
        self, storage: str, name: str, spec: SearchSpec | None = None, worker: str | None = None
    ) -> None:
        self._optuna = import_optuna()
        self._storage, self._lock = open_storage(storage, name)
        self.name = name
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        with self._lock.hold():
            self.spec, self._study_id = open_study(self._storage, name, spec)
            space, problems = parse_space(self.spec.hyperparameters)
            assert not problems, "the stored search was validated when created"
            self._space = space
            self._method = method_for(self.spec.searcher, space)
            length = self.spec.searcher.length()
            self._unit = length[0] if length else None
            records, _ = self._load()
            self._create(self._method.top_up(records), records)

    # -- reading the search back from the study --------------------------------------------
    def _load(self) -> tuple[list[Record], dict[int, Any]]:
        """The search's records in creation order, and their Optuna trials by number."""
        states = self._optuna.trial.TrialState
        trials = self._storage.get_all_trials(self._study_id, deepcopy=False)
        records: list[Record] = []
        frozen: dict[int, Any] = {}
        for trial in trials:
            info = trial.system_attrs.get(_TRIAL)
            if info is None:
                continue  # a trial someone else added to the study
            state = trial.system_attrs.get(_STATE, {})
            records.append(
                Record(
                    number=info["request"],
                    bracket=info["bracket"],
                    cause=info["cause"],
                    open=trial.state in (states.WAITING, states.RUNNING),
                    invalid=state.get("exit") == "invalid_hp",
                    rung=state.get("rung", 0),
                    rungs={int(k): list(v) for k, v in state.get("rungs", {}).items()},
                    stopped=state.get("stopped", False),
                )
            )
            frozen[info["request"]] = trial
        records.sort(key=lambda r: r.number)
        return records, frozen

    def _create(self, creates: list[Create], records: list[Record]) -> None:
        causes = {r.cause for r in records}
        seed_base = self.spec.experiment_seed
        assert seed_base is not None
        for create in creates:
            if create.cause in causes:
                continue
            request = len(records)
            seed, hparams = trial_draw(self._space, seed_base, request)
            if create.point is not None:
                hparams = create.point
            params, dists = params_and_distributions(self._space, hparams)
            info = {
                "request": request,
                "bracket": create.bracket,
                "cause": create.cause,
                "seed": seed,
                "hparams": hparams,
            }
            template = self._optuna.trial.create_trial(
                state=self._optuna.trial.TrialState.WAITING,
                params=params,
                distributions=dists,
                system_attrs={_TRIAL: info},
            )
            self._storage.create_new_trial(self._study_id, template_trial=template)
            records.append(Record(number=request, bracket=create.bracket, cause=create.cause))
            causes.add(create.cause)

    def _spec(self, trial: Any) -> TrialSpec:
        info = trial.system_attrs[_TRIAL]
        return TrialSpec(
            number=info["request"],
            hparams=info["hparams"],
            seed=info["seed"],
            bracket=info["bracket"],
            rungs=tuple(self._method.rung_lengths(info["bracket"])),
            unit=self._unit,
            resumed=bool(trial.system_attrs.get(_RESUME, False)),
            notes={
                k[len(_NOTE) :]: v for k, v in trial.system_attrs.items() if k.startswith(_NOTE)
            },
        )

    def _write_state(
        self,
        trial: Any,
        record: Record,
        exit: str | None = None,
        report: tuple[int, float, bool] | None = None,
    ) -> None:
        before = trial.system_attrs.get(_STATE, {})
        now = time.time()
        state: dict[str, Any] = {
            "rung": record.rung,
            "rungs": {str(k): v for k, v in record.rungs.items()},
            "stopped": record.stopped,
            "beat": now,  # a report is a heartbeat too (see `requeue_stale`)
            "reports": list(before.get("reports", [])),
        }
        if report is not None:
            state["reports"].append([*report, now])
        if exit is not None:
            state["exit"] = exit
        self._storage.set_trial_system_attr(trial._trial_id, _STATE, state)

    def _find(self, trial: TrialSpec | int) -> tuple[list[Record], Record, Any]:
        """The records, the trial's record and its Optuna trial."""
        number = trial if isinstance(trial, int) else trial.number
        records, frozen = self._load()
        if number not in frozen:
            raise InvalidArgumentError(f"trial {number} is not part of search {self.name!r}")
        record = next(r for r in records if r.number == number)
        return records, record, frozen[number]

    def _held(self, trial: TrialSpec | int, frozen: Any) -> bool:
        """Whether `trial` is running, and (for a TrialSpec from a pull) still under that
        pull: the caller may report, close it or give it back."""
        if frozen.state != self._optuna.trial.TrialState.RUNNING:
            return False
        if isinstance(trial, TrialSpec) and trial.attempt:
            return int(frozen.system_attrs.get(_WORKER, {}).get("attempt", 0)) == trial.attempt
        return True

    # -- the API a runner uses ---------------------------------------------------------------
    def next_trial(self) -> TrialSpec | None:
        """The oldest pending trial, now running in this worker; None when none is pending
        (the search may still create more when running trials report: see `is_finished`)."""
        waiting = self._optuna.trial.TrialState.WAITING
        running = self._optuna.trial.TrialState.RUNNING
        with self._lock.hold():
            trials = self._storage.get_all_trials(self._study_id, deepcopy=False, states=(waiting,))
            for trial in sorted(trials, key=lambda t: t.number):
                if _TRIAL not in trial.system_attrs:
                    continue
                if self._storage.set_trial_state_values(trial._trial_id, running):
                    attempt = int(trial.system_attrs.get(_WORKER, {}).get("attempt", 0)) + 1
                    pulled: dict[str, Any] = {
                        "worker": self.worker,
                        "since": time.time(),
                        "attempt": attempt,
                    }
                    self._storage.set_trial_system_attr(trial._trial_id, _WORKER, pulled)
                    return dataclasses.replace(self._spec(trial), attempt=attempt)
        return None

    def report(self, trial: TrialSpec | int, length: int, metric: float) -> Decision:
        """`trial` validated after `length` units of training with searcher metric `metric`."""
        with self._lock.hold():
            records, record, frozen = self._find(trial)
            if not self._held(trial, frozen):
                return Decision(stop=True)  # closed, or given back: not this run's to train
            self._storage.set_trial_intermediate_value(frozen._trial_id, int(length), float(metric))
            smaller = self.spec.searcher.smaller_is_better
            stop, creates = self._method.on_report(
                records, record, int(length), signed(float(metric), smaller)
            )
            self._create(creates, records)
            self._write_state(frozen, record, report=(int(length), float(metric), stop))
        rungs = self._method.rung_lengths(record.bracket)
        upcoming = [r for r in rungs if r > length]
        return Decision(stop=stop, next_rung=None if stop or not upcoming else upcoming[0])

    def complete(self, trial: TrialSpec | int, early: bool = False) -> None:
        """`trial` finished training (its max_length, or a stop) and closed normally;
        `early`: it stopped on its own before either (the trial asked to stop), which the
        searcher takes as an early exit, as Determined's does."""
        states = self._optuna.trial.TrialState
        with self._lock.hold():
            records, record, frozen = self._find(trial)
            if not self._held(trial, frozen):
                return
            record.open = False
            if early and not record.stopped:
                creates = self._method.on_early_exit(records, record, False)
            else:
                creates = self._method.on_close(records, record)
            self._create(creates, records)
            top = len(self._method.rung_lengths(record.bracket)) - 1
            pruned = record.stopped and record.rung < top
            self._write_state(frozen, record, exit="stopped" if pruned else "completed")
            values = frozen.intermediate_values
            last = [values[max(values)]] if values else None
            self._storage.set_trial_state_values(
                frozen._trial_id, states.PRUNED if pruned else states.COMPLETE, last
            )

    def fail(self, trial: TrialSpec | int, invalid_hp: bool = False) -> None:
        """`trial` exited early: an error, or InvalidHP (`invalid_hp`), which the searcher
        replaces where Determined's does."""
        with self._lock.hold():
            records, record, frozen = self._find(trial)
            if not self._held(trial, frozen):
                return
            record.open = False
            self._create(self._method.on_early_exit(records, record, invalid_hp), records)
            self._write_state(frozen, record, exit="invalid_hp" if invalid_hp else "errored")
            self._storage.set_trial_state_values(
                frozen._trial_id, self._optuna.trial.TrialState.FAIL
            )

    def pause(self, trial: TrialSpec | int) -> None:
        """Give `trial` back: pending again, to resume from its checkpoint (Ctrl-C, a worker
        shutting down)."""
        with self._lock.hold():
            _, _, frozen = self._find(trial)
            if self._held(trial, frozen):
                self._requeue(frozen._trial_id)

    def _requeue(self, trial_id: int) -> None:
        self._storage.set_trial_system_attr(trial_id, _RESUME, True)
        self._storage.set_trial_state_values(trial_id, self._optuna.trial.TrialState.WAITING)

    def heartbeat(self, trial: TrialSpec | int) -> None:
        """`trial` is alive (see `requeue_stale`)."""
        with self._lock.hold():
            _, _, frozen = self._find(trial)
            if self._held(trial, frozen):  # a closed trial's attributes cannot change
                self._storage.set_trial_system_attr(frozen._trial_id, _HEARTBEAT, time.time())

    def lost(self, trial: TrialSpec | int, give_back: bool) -> bool:
        """The process that ran `trial` is gone. If the trial is still running (that process
        neither closed it nor gave it back), give it back (`give_back`: the run was stopped)
        or close it as errored. Returns whether it was still running."""
        with self._lock.hold():
            records, record, frozen = self._find(trial)
            if not self._held(trial, frozen):
                return False
            if give_back:
                self._requeue(frozen._trial_id)
                return True
            record.open = False
            self._create(self._method.on_early_exit(records, record, False), records)
            self._write_state(frozen, record, exit="errored")
            self._storage.set_trial_state_values(
                frozen._trial_id, self._optuna.trial.TrialState.FAIL
            )
        return True

    def note(self, trial: TrialSpec | int, key: str, value: Any) -> None:
        """Keep `value` (JSON) on `trial` under `key`; `TrialSpec.notes` has it next time."""
        with self._lock.hold():
            _, _, frozen = self._find(trial)
            self._storage.set_trial_system_attr(frozen._trial_id, _NOTE + key, value)

    def set_search_note(self, key: str, value: Any) -> None:
        """Keep `value` (JSON) on the search under `key`: what its workers need to know."""
        self._storage.set_study_system_attr(self._study_id, _NOTE + key, value)

    def search_note(self, key: str) -> Any:
        """What `set_search_note` kept under `key` (None when nothing was)."""
        return self._storage.get_study_system_attrs(self._study_id).get(_NOTE + key)

    def requeue_orphans(self) -> list[int]:
        """Put back running trials pulled by a process of this host that is gone (a worker
        killed before it could give its trials back); returns their numbers."""
        running = self._optuna.trial.TrialState.RUNNING
        host, numbers = socket.gethostname(), []
        with self._lock.hold():
            for trial in self._storage.get_all_trials(self._study_id, states=(running,)):
                attrs = trial.system_attrs
                worker = str(attrs.get(_WORKER, {}).get("worker", ""))
                name, _, pid = worker.rpartition(":")
                if _TRIAL in attrs and name == host and pid.isdigit() and not pid_alive(int(pid)):
                    self._requeue(trial._trial_id)
                    numbers.append(attrs[_TRIAL]["request"])
        return numbers

    def requeue_stale(self, timeout_s: float) -> list[int]:
        """Put back running trials not heard of (pulled, reported, `heartbeat`) for more than
        `timeout_s` (their worker died); returns their numbers."""
        running = self._optuna.trial.TrialState.RUNNING
        now, numbers = time.time(), []
        with self._lock.hold():
            for trial in self._storage.get_all_trials(self._study_id, states=(running,)):
                attrs = trial.system_attrs
                if _TRIAL in attrs:
                    beats = (
                        attrs.get(_HEARTBEAT, 0.0),
                        attrs.get(_STATE, {}).get("beat", 0.0),
                        attrs.get(_WORKER, {}).get("since", 0.0),
                    )
                    if now - max(beats) > timeout_s:
                        self._requeue(trial._trial_id)
                        numbers.append(attrs[_TRIAL]["request"])
        return numbers

    def is_finished(self) -> bool:
        """Whether every trial of the search has closed and none is left to create."""
        with self._lock.hold():
            records, _ = self._load()
        return not any(r.open for r in records)

    def trials(self) -> list[TrialView]:
        """Every trial of the search in creation order."""
        states = self._optuna.trial.TrialState
        names = {states.WAITING: "waiting", states.RUNNING: "running"}
        with self._lock.hold():
            records, frozen = self._load()
        views = []
        for record in records:
            trial = frozen[record.number]
            info = trial.system_attrs[_TRIAL]
            exit = trial.system_attrs.get(_STATE, {}).get("exit", "")
            views.append(
                TrialView(
                    number=record.number,
                    state=names.get(trial.state, exit),
                    hparams=info["hparams"],
                    seed=info["seed"],
                    bracket=record.bracket,
                    rungs=record.rungs,
                    metrics=dict(trial.intermediate_values),
                    reports=[
                        (int(r[0]), float(r[1]), bool(r[2]), float(r[3]))
                        for r in trial.system_attrs.get(_STATE, {}).get("reports", [])
                    ],
                )
            )
        return views

    def close(self) -> None:
        """Release the storage's lock handle (the storage itself needs no closing)."""
        self._lock.close()
