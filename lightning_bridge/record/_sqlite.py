"""The SQLite engine of the experiment record: WAL mode, synced commits, queued writers.

Several processes open the same database at once (the runner, the trials, the commands). A
writer takes the write lock when its transaction begins (`BEGIN IMMEDIATE`), so two writers
queue on the busy timeout instead of deadlocking on a read-to-write upgrade. Switching a
database to WAL can still be refused at once, without waiting (SQLite does so when waiting
could deadlock, e.g. while another process opens or recovers the file): that step is retried
until the same timeout.
"""

from __future__ import annotations

import pathlib
import sqlite3
import time
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from lightning_bridge._private import create_file, make_dir

BUSY_TIMEOUT_S = 120
_RETRY_PAUSE_S = 0.05


def _use_wal(connection: sqlite3.Connection, timeout_s: float = BUSY_TIMEOUT_S) -> None:
    """Put the database in WAL mode, retrying while another process holds it locked."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(_RETRY_PAUSE_S)


def sqlite_engine(path: pathlib.Path, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Engine:
    """An engine on the database file `path` (created with its folder when missing); a
    writer waits up to `busy_timeout_s` for another's lock. A new folder and file are private
    (`_private`): the record holds the configs, secrets included; SQLite gives its journal
    files the database's mode."""
    make_dir(path.parent)
    create_file(path)
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": busy_timeout_s, "isolation_level": None},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        _use_wal(dbapi_connection, busy_timeout_s)
        dbapi_connection.execute("PRAGMA synchronous=FULL")
        dbapi_connection.execute("PRAGMA foreign_keys=ON")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
