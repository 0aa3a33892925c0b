"""The PostgreSQL engine of an experiment record shared by several machines.

A workspace whose settings name a `record` URL (`_settings`) keeps its record there: every
trial, on any node, writes to the same database. Writers are one at a time, as SQLite's
`BEGIN IMMEDIATE` makes them on one machine: each transaction first takes a transaction-level
advisory lock, so a read-then-write (a trial's end, a checkpoint's state) never interleaves
with another process's. Creating the tables takes the same lock, so two processes opening a
new database at once do not both create them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from lightning_bridge import _postgres as _driver
from lightning_bridge._secrets import redact_url

_KEY = int.from_bytes(hashlib.sha256(b"lightning-bridge:record").digest()[:8], "big", signed=True)
CONNECT_TIMEOUT_S = 10


def shown(url: str) -> str:
    """The URL as messages show it (the password hidden: `_secrets.redact_url`)."""
    return redact_url(url)


def with_driver(url: str) -> str:
    """The record's URL with its driver named (`_postgres.with_driver`)."""
    return _driver.with_driver(url, f"the record {shown(url)}")


def postgres_engine(url: str, busy_timeout_s: float) -> Engine:
    """An engine on the record's database; a writer waits up to `busy_timeout_s` for
    another's lock, a connection up to `CONNECT_TIMEOUT_S` for the server."""
    timeout_ms = max(int(busy_timeout_s * 1000), 1)
    engine = create_engine(
        with_driver(url),
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c lock_timeout={timeout_ms}",
        },
    )

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_KEY})")

    return engine
