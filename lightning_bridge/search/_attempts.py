"""A search's trials as Optuna attempts: the user attrs that hold them, and how they read.

Each trial of a search (a Determined trial, numbered by creation: its request) is one Optuna
trial per attempt at training it, as Optuna retries a trial whose process was lost:

- created WAITING by `Study.enqueue_trial` when the searcher decides on it, with what is fixed
  (request, bracket, cause, trial seed, hyperparameters) in the user attr `TRIAL`;
- RUNNING once a worker pulls it (`Study.ask`), with who pulled it in `PULL`;
- then told COMPLETE, PRUNED (stopped at a rung below the top), or FAIL (an error, InvalidHP,
  or given back to be resumed: `STATE`'s `exit` says which);
- a trial given back is attempted again as a new Optuna trial that copies the last attempt
  (parameters, attrs, reported metrics), made RUNNING by the worker that pulls it.

The searcher's state (rungs, stops, every report) is in the attempt's user attr `STATE`, one
write per event; reported metrics are its intermediate values, keyed by length. The search's
own config is the study's user attr `SEARCH` (see `_storage.SearchStudy`).
"""

from __future__ import annotations

import functools
from typing import Any

from lightning_bridge.search._methods import Record
from lightning_bridge.search._storage import import_optuna

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
