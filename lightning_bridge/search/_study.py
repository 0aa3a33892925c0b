"""The Optuna study that holds a search, and how the search's trials read in it.

A search is an Optuna study: created with the search's config (a study user attr) the first
time, checked against it afterwards, so a search is only ever continued as it was started.
Each trial of the search (a Determined trial, numbered by creation: its request) is one
Optuna trial per attempt at training it, as Optuna retries a trial whose process was lost:

- created WAITING by `Study.enqueue_trial` when the searcher decides on it, with what is fixed
  (request, bracket, cause, trial seed, hyperparameters) in the user attr `TRIAL`;
- RUNNING once a worker pulls it (`Study.ask`), with who pulled it in `PULL`;
- then told COMPLETE, PRUNED (stopped at a rung below the top), or FAIL (an error, InvalidHP,
  or given back to be resumed: `STATE`'s `exit` says which);
- a trial given back is attempted again as a new Optuna trial that copies the last attempt
  (parameters, attrs, reported metrics), made RUNNING by the worker that pulls it.

The searcher's state (rungs, stops, every report) is in the attempt's user attr `STATE`, one
write per event; reported metrics are its intermediate values, keyed by length.
"""

from __future__ import annotations

import functools
import json
import secrets
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.search._methods import Record
from lightning_bridge.search._storage import import_optuna, open_storage
from lightning_bridge.search._views import SearchSpec

SEARCH = "lightning_bridge:search"  # study: the search's config and experiment seed
TRIAL = "lightning_bridge:trial"  # attempt, fixed: request, bracket, cause, seed, hparams
STATE = "lightning_bridge:state"  # attempt, one write per event: rung, rungs, stopped, reports
PULL = "lightning_bridge:pull"  # attempt: worker, since, attempt (1 for the first pull)
BEAT = "lightning_bridge:beat"  # attempt: when its worker last said it is alive
NOTE = "lightning_bridge:note:"  # attempt or study: what workers note for each other
GIVEN_BACK = "given_back"  # STATE's exit of an attempt given back (pending again)


@functools.cache
def _states() -> Any:
    return import_optuna().trial.TrialState


def current_attempts(trials: list[Any]) -> dict[int, Any]:
    """The latest attempt (an Optuna `FrozenTrial`) of each trial of the search, by request, in
    request order; trials someone else added to the study are left out."""
    latest: dict[int, Any] = {}
    for trial in trials:
        info = trial.user_attrs.get(TRIAL)
        if info is not None:
            request = int(info["request"])
            if request not in latest or trial.number > latest[request].number:
                latest[request] = trial
    return dict(sorted(latest.items()))


def exit_of(attempt: Any) -> str | None:
    """How an attempt ended as the search saw it (completed, stopped, errored, invalid_hp,
    given_back), None while it is open."""
    exit: str | None = attempt.user_attrs.get(STATE, {}).get("exit")
    return exit


def is_pending(attempt: Any) -> bool:
    """Whether the trial waits for a worker: never pulled, or given back."""
    state = _states()
    return attempt.state == state.WAITING or (
        attempt.state == state.FAIL and exit_of(attempt) == GIVEN_BACK
    )


def record_of(attempt: Any) -> Record:
    """The trial as the search method sees it, from its latest attempt."""
    info, state = attempt.user_attrs[TRIAL], attempt.user_attrs.get(STATE, {})
    return Record(
        number=int(info["request"]),
        bracket=int(info["bracket"]),
        cause=str(info["cause"]),
        open=attempt.state == _states().RUNNING or is_pending(attempt),
        invalid=state.get("exit") == "invalid_hp",
        rung=int(state.get("rung", 0)),
        rungs={int(k): list(v) for k, v in state.get("rungs", {}).items()},
        stopped=bool(state.get("stopped", False)),
    )


class SearchStudy:
    """A search's Optuna study in a storage, its lock, and live handles on its trials.

    Created from `spec` the first time; opened and checked against `spec` (when given)
    afterwards. The caller sets the study's sampler and pruner.
    """

    def __init__(self, url: str, name: str, spec: SearchSpec | None) -> None:
        self._optuna = import_optuna()
        self.name = name
        self.storage, self.lock = open_storage(url, name)
        self._study_id: int | None = None
        # Handles kept for the process's life: an attempt is reported to by one process only,
        # so what a handle caches of it (its metrics) stays true.
        self._handles: dict[int, Any] = {}
        with self.lock.hold():
            self.study, self.spec = self._open(spec)

    def _open(self, spec: SearchSpec | None) -> tuple[Any, SearchSpec]:
        optuna, name = self._optuna, self.name
        placeholder = optuna.samplers.RandomSampler()
        if name in optuna.study.get_all_study_names(self.storage):
            study = optuna.load_study(study_name=name, storage=self.storage, sampler=placeholder)
        elif spec is None:
            raise InvalidArgumentError(
                f"no search named {name!r} in this storage; check the name and --storage"
            )
        else:
            seed = spec.experiment_seed
            if seed is None:
                seed = secrets.randbelow(1 << 31)
            study = optuna.create_study(
                storage=self.storage,
                study_name=name,
                direction="minimize" if spec.searcher.smaller_is_better else "maximize",
                sampler=placeholder,
            )
            study.set_user_attr(SEARCH, spec.to_json(seed))
        stored = study.user_attrs.get(SEARCH)
        if stored is None:
            raise InvalidArgumentError(
                f"the study {name!r} in this storage was not made by lightning-bridge; "
                "give the search another name"
            )
        if spec is not None:
            seed = spec.experiment_seed
            given = spec.to_json(stored["experiment_seed"] if seed is None else seed)
            if json.dumps(given, sort_keys=True) != json.dumps(stored, sort_keys=True):
                raise InvalidArgumentError(
                    f"the search {name!r} in this storage was started with another searcher, "
                    "hyperparameters or experiment seed; continue it as it was, or start a new "
                    "search under another name"
                )
        return study, SearchSpec.from_json(stored)

    def attempts(self) -> dict[int, Any]:
        """`current_attempts` of the study as it is now."""
        return current_attempts(self.study.get_trials(deepcopy=False))

    def handle(self, number: int) -> Any:
        """A live `optuna.trial.Trial` on the study's trial `number`, which another process
        may have asked for.

        The one piece of a search Optuna's public API does not carry: it hands a `Trial` (to
        report to, prune, set attrs on) only to the process that asks for it, and takes a
        trial's number in `Study.tell` alone; a Determined trial is pulled by a worker,
        reported to by its own process and closed or given back by either. So the handle is
        rebuilt from the trial's storage id, the only use of Optuna's storage interface here.
        """
        if number not in self._handles:
            if self._study_id is None:
                self._study_id = self.storage.get_study_id_from_name(self.name)
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
            self._handles[number] = self._optuna.trial.Trial(self.study, trial_id)
        return self._handles[number]

    def ask(self, distributions: dict[str, Any]) -> Any:
        """`Study.ask` (the oldest waiting trial, now running), its handle kept."""
        trial = self.study.ask(fixed_distributions=distributions)
        self._handles[trial.number] = trial
        return trial

    def close(self) -> None:
        """Release the lock's handle (the storage itself needs no closing)."""
        self.lock.close()
