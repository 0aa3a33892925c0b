"""The driver a `postgresql://` URL is opened with. The record and a search's storage both take
such URLs, and SQLAlchemy needs the driver named in them."""

from __future__ import annotations

from lightning_bridge._errors import InvalidArgumentError


def with_driver(url: str, what: str) -> str:
    """`url` (`postgresql://` / `postgres://`) with an installed driver named: psycopg 3, else
    psycopg2; a URL that names its driver (`postgresql+DRIVER://`) is kept. Without a driver,
    one message naming `what` (how the user gave the URL) and the extra that installs one."""
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
        f"{what} is a PostgreSQL server, and no PostgreSQL driver for Python is installed; "
        "install the postgres extra: pip install 'lightning-bridge[postgres]'"
    )
