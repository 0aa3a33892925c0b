"""`--storage` checked before anything is recorded: it names a search storage, and (for a
worker) the search it names is there.

`run` refuses a `--storage` that is not one (an existing file that is not an Optuna journal, a
file that is not an SQLite database, a scheme Optuna does not store in, a server that does not
answer) before the experiment is recorded, so a refusal leaves nothing behind. `search-worker`
joins a search that exists: a path that does not exist, or a storage without that search, is
refused before the worker opens the storage (which would create a journal and its lock file).
The check reads the storage through Optuna's public API (`get_all_study_names`) only. It is the
search layer's, beside the storage it checks (`_storage`): the commands run it before they
record anything, the launchers' pre-flight and a Slurm job before a trial starts.
"""

from __future__ import annotations

import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._secrets import redact_url
from lightning_bridge.search._storage import import_optuna

_FORMS = "a journal file path, sqlite:///FILE or postgresql://USER:PASSWORD@HOST/DATABASE"
_SQLITE_HEADER = b"SQLite format 3\x00"


def _reason(exc: BaseException) -> str:
    """An exception in one short line: its type and its first line (the driver's own error
    rather than SQLAlchemy's wrapping)."""
    inner = getattr(exc, "orig", None) or exc
    lines = str(inner).strip().splitlines() or [""]
    return f"{type(inner).__name__}: {lines[0][:200]}"


def _refuse(url: str, problem: str, fix: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"--storage {redact_url(url)}: {problem}; {fix}")


def _study_names(url: str, storage: Any) -> list[str]:
    """The searches (Optuna studies) in `storage`, or one message saying it is not one."""
    optuna = import_optuna()
    try:
        return list(optuna.get_all_study_names(storage))
    except Exception as exc:  # noqa: BLE001 - each back end fails in its own way
        raise _refuse(
            url,
            f"it is not a search storage ({_reason(exc)})",
            f"give {_FORMS} (a new file for a new search)",
        ) from None


def _file_storage(url: str, path: pathlib.Path, existing: bool) -> Any:
    """The journal file storage at `path`, read only (None when there is no file yet)."""
    if path.is_dir():
        raise _refuse(url, "it is a folder", "give a journal file path inside it")
    if not path.exists():
        if existing:
            raise _refuse(
                url,
                "no such file, so no search is stored there",
                "give the --storage the search was started with (printed by its run)",
            )
        return None
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_HEADER))
    if head == _SQLITE_HEADER:
        raise _refuse(url, "it is an SQLite database, not a journal file", f"use sqlite:///{path}")
    optuna = import_optuna()
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    try:
        return optuna.storages.JournalStorage(backend)
    except Exception as exc:  # noqa: BLE001 - a journal that does not parse
        raise _refuse(
            url,
            f"the file exists and is not an Optuna journal ({_reason(exc)})",
            "give a new path for a new search, or the journal a search was started with",
        ) from None


def _database_storage(url: str, scheme: str, existing: bool) -> Any:
    import sqlalchemy

    optuna = import_optuna()
    if scheme == "sqlite":
        file = sqlalchemy.engine.make_url(url).database
        path = pathlib.Path(file).expanduser().resolve() if file else None
        if path is not None and path.exists():
            with open(path, "rb") as f:
                if f.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                    raise _refuse(
                        url,
                        f"{path} exists and is not an SQLite database",
                        "give a new file for a new search, or the database a search was "
                        "started with",
                    )
        elif existing or path is None:
            if path is None:
                return None  # in-memory: the search layer says why it is refused
            raise _refuse(
                url,
                f"{path} does not exist, so no search is stored there",
                "give the --storage the search was started with (printed by its run)",
            )
        else:
            return None  # a new database file, created with the search
    else:
        from lightning_bridge.search._storage import postgresql_url

        url_with_driver = postgresql_url(url)
        engine = sqlalchemy.create_engine(url_with_driver, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - the driver's own errors
            raise _refuse(
                url,
                f"the server does not answer ({_reason(exc)})",
                "check the host, the database, the user and that the server runs",
            ) from None
        finally:
            engine.dispose()
        url = url_with_driver
    try:
        return optuna.storages.RDBStorage(url, skip_table_creation=existing)
    except Exception as exc:  # noqa: BLE001
        raise _refuse(
            url, f"it is not a search storage ({_reason(exc)})", f"give {_FORMS}"
        ) from None


def check_search_storage(url: str, search: str | None = None) -> None:
    """Refuse a `--storage` that is not a search storage; with `search` (a worker joining
    it), also one where that search does not exist. Creates nothing."""
    if "://" not in url:
        storage = _file_storage(url, pathlib.Path(url).expanduser().resolve(), search is not None)
    else:
        scheme = url.split("://", 1)[0].split("+", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgres"):
            raise _refuse(
                url, f"{scheme}:// is not a storage a search can live in", f"give {_FORMS}"
            )
        storage = _database_storage(url, scheme, search is not None)
    if storage is None:
        return
    try:
        names = _study_names(url, storage)
    finally:
        engine = getattr(storage, "engine", None)
        if engine is not None:
            engine.dispose()
    if search is not None and search not in names:
        listed = ", ".join(sorted(names)[:10]) or "none"
        raise _refuse(
            url,
            f"it holds no search named {search!r} (searches there: {listed})",
            "give the name and --storage printed by the `lightning-bridge run` that started it",
        )
