"""Where a search lives: an Optuna storage, and the lock that makes its decisions one at a time.

A storage is named by one string:

- a file path (`search.journal`, no scheme): Optuna's journal file, the default; several
  processes on one machine (or on a file system they share) serve one search;
- `sqlite:///path/search.db`: an SQLite database file, same reach;
- `postgresql://user:password@host/db`: a PostgreSQL server, reachable from several machines.

Determined's searcher takes one event at a time; so does a search here: every decision
(pulling a trial, ranking a metric, creating the next trials) runs under a `SearchLock` held
across processes. Optuna has no such lock (its samplers and pruners are written to tolerate
concurrent trials, deciding on whatever they read), and without it two trials reaching a rung
together would each be ranked without the other, and a stop could start its replacement twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._postgres import with_driver

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


class SearchLock:
    """One holder at a time across processes, released by the system when its holder dies (a
    killed worker never leaves a search locked): an exclusive `flock` on the file `path` (beside
    a journal or SQLite file), or a PostgreSQL session advisory lock keyed by the search's
    `name` on a connection of its own to `url`. A thread lock orders the threads of one
    process (they share the file or the connection)."""

    def __init__(self, *, path: pathlib.Path | None = None, url: str = "", name: str = "") -> None:
        self._thread = threading.Lock()
        self._fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            return
        import sqlalchemy

        self._engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        self._conn = self._engine.connect()
        digest = hashlib.sha256(f"lightning-bridge:{name}".encode()).digest()
        self._key = {"k": int.from_bytes(digest[:8], "big", signed=True)}
        self._lock_sql = sqlalchemy.text("SELECT pg_advisory_lock(:k)")
        self._unlock_sql = sqlalchemy.text("SELECT pg_advisory_unlock(:k)")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread:
            if self._fd is not None:
                import fcntl  # POSIX; imported here so the rest of the package loads everywhere

                fcntl.flock(self._fd, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                return
            self._conn.execute(self._lock_sql, self._key)
            try:
                yield
            finally:
                self._conn.execute(self._unlock_sql, self._key)
                self._conn.commit()

    def close(self) -> None:
        """Release the lock's file or connection."""
        if self._fd is not None:
            os.close(self._fd)
        else:
            self._conn.close()
            self._engine.dispose()


def _parse(url: str) -> tuple[str, str, pathlib.Path | None]:
    """(scheme, URL with its driver, file) of a storage URL; the scheme is "journal" for a
    path. Refuses what cannot hold a search with one message."""
    if "://" not in url:
        return "journal", url, pathlib.Path(url).expanduser().resolve()
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        import sqlalchemy

        file = sqlalchemy.engine.make_url(url).database
        if not file or file == ":memory:":
            raise InvalidArgumentError(
                f"--storage {url!r}: an in-memory database cannot hold a search that several "
                "processes share or that resumes; give a file, e.g. sqlite:///search.db"
            )
        return scheme, url, pathlib.Path(file).expanduser().resolve()
    if scheme in ("postgresql", "postgres"):
        return "postgresql", postgresql_url(url), None
    raise InvalidArgumentError(
        f"--storage {url!r}: expected a journal file path, sqlite:///FILE or "
        "postgresql://USER:PASSWORD@HOST/DATABASE"
    )


def open_storage(url: str, name: str) -> tuple[Any, SearchLock]:
    """The Optuna storage `url` names (created when missing) and the search's lock."""
    optuna = import_optuna()
    scheme, url, path = _parse(url)
    if path is not None:
        lock = SearchLock(path=path.with_name(path.name + ".search-lock"))
    else:
        lock = SearchLock(url=url, name=name)
    with lock.hold():
        if scheme == "journal":
            assert path is not None
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            return optuna.storages.JournalStorage(backend), lock
        kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if scheme == "sqlite" else {}
        rdb = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        if scheme == "sqlite":
            _write_ahead(rdb.engine)
    return rdb, lock


def search_exists(url: str, name: str) -> bool:
    """Whether the storage `url` holds a search (an Optuna study) named `name`. Creates
    nothing: a missing journal or SQLite file, or a database without Optuna's tables, holds
    none. Raises `InvalidArgumentError` for a URL that names no storage, a database that cannot
    be reached, or a missing Optuna or PostgreSQL driver."""
    optuna = import_optuna()
    scheme, url, path = _parse(url)
    if path is not None and not path.is_file():
        return False
    if scheme == "journal":
        backend = optuna.storages.journal.JournalFileBackend(str(path))
        storage: Any = optuna.storages.JournalStorage(backend)
    else:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            if not sqlalchemy.inspect(engine).has_table("studies"):
                return False
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise InvalidArgumentError(
                f"--storage: cannot read the search's database ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}); check the host, database and credentials"
            ) from None
        finally:
            engine.dispose()
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
    return name in optuna.study.get_all_study_names(storage)


def postgresql_url(url: str) -> str:
    """A `--storage` PostgreSQL URL with its driver named (`_postgres.with_driver`)."""
    return with_driver(url, "--storage postgresql://...")


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
