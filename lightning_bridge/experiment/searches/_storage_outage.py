"""The search's storage away for a while (a database server restarting), as a search's worker
and its Slurm worker jobs' follower ride it out (`StorageOutage`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable


class StorageOutage:
    """The search's storage away for a while (a database server restarting), as a search's
    worker (`SearchWorker`) or the follower of its worker jobs (`WorkerJobs`) rides it out:
    since when, and whether its connections must be opened again before the next use (they
    do not recover). The one home of the retry-and-reopen both follow; each says and refuses
    in its own words."""

    def __init__(self) -> None:
        self.since: float | None = None
        self._reopen = False

    def away(self, close: Callable[[], None]) -> float | None:
        """The storage did not answer: None the first time (the caller says so), else the
        seconds since (the caller gives up past `RETRY_S`). Its connections are closed
        (`close`) once, to be opened again (`reopen`)."""
        now = time.monotonic()
        first = self.since is None
        if self.since is None:
            self.since = now
        if not self._reopen:
            self._reopen = True
            with contextlib.suppress(Exception):  # a connection that is already gone
                close()
        return None if first else now - self.since

    def back(self) -> float | None:
        """The storage answered: the seconds it was away (None: it was not)."""
        since, self.since = self.since, None
        return None if since is None else time.monotonic() - since

    def reopen(self) -> bool:
        """Whether the connections are to be opened again now (once after an outage)."""
        reopen, self._reopen = self._reopen, False
        return reopen
