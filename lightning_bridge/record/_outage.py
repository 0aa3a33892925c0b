"""Writes to a service that may be away for a while: the record's database (a file another
process holds locked) or a search's storage (a PostgreSQL server restarting).

A trial does not stop training because a service it reports to is briefly unavailable. Its
writes go through a `HeldBack` queue, one per service, in the order made: each is tried once
(quickly); one the service cannot take now waits, with every later one behind it, and the
queue is tried again at the next write. When the service is back, the writes held back are
made in order and one log line says so; at the end of the fit the queue is retried for a
bound (`RETRY_S`) and what could still not be written is named in one error line. A write
that fails is not applied (a database transaction that does not commit), so a write retried
is never recorded twice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("lightning_bridge")

# How long the end of a fit waits for a service that is away (seconds).
RETRY_S = float(os.environ.get("LIGHTNING_BRIDGE_RETRY_S", "300"))

# While a service is away, a new write tries the ones held back at most this often (seconds).
RETRY_EVERY_S = 5.0

# Errors that say the service is away, not that the write is wrong: a lost or refused
# connection, a database locked beyond the busy timeout, a transaction the lost connection
# left behind, and Optuna's wrapping of such an error.
_UNAVAILABLE = {
    "OperationalError",
    "InterfaceError",
    "PendingRollbackError",
    "StorageInternalError",
    "TimeoutError",
}
_FROM = ("sqlalchemy", "sqlite3", "psycopg", "psycopg2", "optuna")


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` (or an error it was raised from) says a database is away."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__.split(".")[0]
        if type(current).__name__ in _UNAVAILABLE and module in _FROM:
            return True
        if getattr(current, "connection_invalidated", False):
            return True
        current = current.__cause__ or current.__context__
    return False


def reason(exc: BaseException) -> str:
    inner = getattr(exc, "orig", None) or exc.__cause__ or exc
    lines = str(inner).strip().splitlines() or [type(inner).__name__]
    return lines[0][:200]


class HeldBack:
    """The writes to one service (`name`, as the log names it), in order, held back while it
    is away. `reset` is called after a failure (to drop a connection that will not recover)."""

    def __init__(self, name: str, reset: Callable[[], None] | None = None) -> None:
        self.name = name
        self._reset = reset
        self._pending: list[tuple[str, Callable[[], Any]]] = []
        self._away_since: float | None = None
        self._next_try = 0.0
        self._held = 0

    @property
    def pending(self) -> list[str]:
        return [what for what, _ in self._pending]

    def write(self, what: str, op: Callable[[], Any]) -> bool:
        """Make the write `op` (described by `what`) after those held back; returns whether
        every write so far is made."""
        self._pending.append((what, op))
        if self._away_since is not None and time.monotonic() < self._next_try:
            return False  # away: tried again a little later, training goes on meanwhile
        return self.drain()

    def drain(self) -> bool:
        """Try the writes held back, in order; whether none is left."""
        while self._pending:
            what, op = self._pending[0]
            try:
                op()
            except Exception as exc:
                if not is_unavailable(exc):
                    self._pending.pop(0)  # a wrong write: raised once, never retried
                    raise
                self._away(exc)
                return False
            self._pending.pop(0)
            if self._away_since is not None:
                self._held += 1
        if self._away_since is not None:
            logger.warning(
                "%s is back after %.0f s: wrote the %d reports held back meanwhile",
                self.name,
                time.monotonic() - self._away_since,
                self._held,
            )
            self._away_since, self._held = None, 0
        return True

    def _away(self, exc: BaseException) -> None:
        self._next_try = time.monotonic() + RETRY_EVERY_S
        if self._reset is not None:
            try:
                self._reset()
            except Exception:  # noqa: BLE001 - closing what is already broken
                pass
        if self._away_since is None:
            self._away_since = time.monotonic()
            logger.warning(
                "%s is unavailable (%s); training goes on, and what it cannot write now is "
                "written when it is back",
                self.name,
                reason(exc),
            )

    def flush(self, within_s: float = RETRY_S) -> bool:
        """Retry the writes held back for up to `within_s` seconds (the fit ends); one error
        line names those still not written. Returns whether all were written."""
        deadline = time.monotonic() + within_s
        pause = 0.25
        while not self.drain():
            if time.monotonic() >= deadline:
                logger.error(
                    "%s stayed unavailable for %.0f s: could not write %s",
                    self.name,
                    time.monotonic() - (self._away_since or deadline - within_s),
                    "; ".join(self.pending),
                )
                return False
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 5.0)
        return True
