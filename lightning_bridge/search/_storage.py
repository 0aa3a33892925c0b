"""Where a search lives: an Optuna storage, the lock that makes its decisions one at a time,
and the study that holds it (`SearchStudy`).

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

A search is one Optuna study: created with the search's config (the study's user attr `SEARCH`)
the first time, checked against it afterwards, so a search is only ever continued as it was
started. How its trials are kept in the study is `_attempts`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import secrets
import threading
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._postgres import with_driver
from lightning_bridge._private import create_file, make_dir
from lightning_bridge._secrets import redact_url
from lightning_bridge.search._views import SearchSpec

EXTRA = "search"
SEARCH = "lightning_bridge:search"  # the study's user attr: the search's config and seed


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
        f"--storage {redact_url(url)!r}: expected a journal file path, sqlite:///FILE or "
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
        if path is not None:
            make_dir(path.parent)
            create_file(path)  # private, before Optuna creates it
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
