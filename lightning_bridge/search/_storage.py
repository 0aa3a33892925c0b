"""Where a search lives: an Optuna storage, and the lock that makes its decisions one at a time.

A storage is named by one string:

- a file path (`search.journal`, no scheme): Optuna's journal file, the default; several
  processes on one machine (or on a file system they share) serve one search;
- `sqlite:///path/search.db`: an SQLite database file, same reach;
- `postgresql://user:password@host/db`: a PostgreSQL server, reachable from several machines.

Determined's searcher takes one event at a time; so does a search here: every decision
(pulling a trial, ranking a metric, creating the next trials) runs under a lock held across
processes: an exclusive `flock` on a file beside a journal or SQLite file, a PostgreSQL
advisory lock on one connection for a server. Both are released by the system when their
holder dies, so a killed worker never leaves a search locked.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import InvalidArgumentError

if TYPE_CHECKING:
    import optuna

EXTRA = "search"


def import_optuna() -> Any:
    """Optuna, or one message naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise InvalidArgumentError(
            "hyperparameter search runs on Optuna, which is not installed; install the "
            f"search extra: pip install 'lightning-bridge[{EXTRA}]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class FileLock:
    """An exclusive `flock` on a file: one holder at a time across processes; a thread lock
    orders the threads of one process (they share the open file, which flock does not)."""

    def __init__(self, path: pathlib.Path) -> None:
        import fcntl  # POSIX; imported here so the rest of the package loads everywhere

        self._fcntl = fcntl
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._thread = threading.Lock()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread:
            self._fcntl.flock(self._fd, self._fcntl.LOCK_EX)
            try:
                yield
            finally:
                self._fcntl.flock(self._fd, self._fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class AdvisoryLock:
    """A PostgreSQL session advisory lock, keyed by the search's name, on its own connection."""

    def __init__(self, url: str, name: str) -> None:
        import sqlalchemy

        self._engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        self._conn = self._engine.connect()
        digest = hashlib.sha256(f"lightning-bridge:{name}".encode()).digest()
        self._key = int.from_bytes(digest[:8], "big", signed=True)
        self._text = sqlalchemy.text
        self._thread = threading.Lock()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread:
            self._conn.execute(self._text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            try:
                yield
            finally:
                self._conn.execute(self._text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                self._conn.commit()

    def close(self) -> None:
        self._conn.close()
        self._engine.dispose()


Lock = FileLock | AdvisoryLock


def open_storage(url: str, name: str) -> tuple[optuna.storages.BaseStorage, Lock]:
    """The Optuna storage `url` names (created when missing) and the search's lock."""
    optuna = import_optuna()
    if "://" not in url:
        path = pathlib.Path(url).expanduser().resolve()
        lock: Lock = FileLock(path.with_name(path.name + ".search-lock"))
        with lock.hold():
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            return optuna.storages.JournalStorage(backend), lock
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        import sqlalchemy

        file = sqlalchemy.engine.make_url(url).database
        if not file or file == ":memory:":
            raise InvalidArgumentError(
                f"--storage {url!r}: an in-memory database cannot hold a search that several "
                "processes share or that resumes; give a file, e.g. sqlite:///search.db"
            )
        path = pathlib.Path(file).expanduser().resolve()
        lock = FileLock(path.with_name(path.name + ".search-lock"))
        kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}}
    elif scheme in ("postgresql", "postgres"):
        url = postgresql_url(url)
        lock = AdvisoryLock(url, name)
        kwargs = {}
    else:
        raise InvalidArgumentError(
            f"--storage {url!r}: expected a journal file path, sqlite:///FILE or "
            "postgresql://USER:PASSWORD@HOST/DATABASE"
        )
    with lock.hold():
        rdb = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        if scheme == "sqlite":
            _write_ahead(rdb.engine)
    # Optuna's cache keeps finished trials (which never change) and rereads the others.
    return optuna.storages.get_storage(rdb), lock


def postgresql_url(url: str) -> str:
    """`postgresql://` / `postgres://` with an installed driver named (psycopg 3, else
    psycopg2), or one message naming the extra that installs one; a URL naming its driver
    (`postgresql+DRIVER://`) is kept."""
    scheme, rest = url.split("://", 1)
    if "+" in scheme:
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        try:
            __import__(module)
        except ImportError:
            continue
        return f"postgresql+{driver}://{rest}"
    raise InvalidArgumentError(
        "--storage postgresql://...: no PostgreSQL driver for Python is installed; install "
        "the postgres extra: pip install 'lightning-bridge[postgres]'"
    )


def _write_ahead(engine: Any) -> None:
    """SQLite in write-ahead-log mode with normal syncing: a commit costs no fsync of the
    database, and a killed process still leaves it consistent."""
    import sqlalchemy

    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections opened before the listener are not reused
