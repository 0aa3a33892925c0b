"""Why a workspace's registry cannot be opened, in one message that names the fix.

The registry is opened before anything of a run is recorded; a workspace on a read-only file
system, or a registry file that is not an SQLite database (damaged, or another file under its
name), stops the command there with the file named, what is wrong with it and how to go on.
Nothing in the workspace is changed on the way: the checkpoints stay where they are.
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket

from lightning_bridge._errors import WorkspaceError
from lightning_bridge.record._postgres import shown
from lightning_bridge.record._settings import SETTINGS_FILE

_READ_ONLY = ("readonly database", "read-only", "unable to open database file")
_DAMAGED = ("file is not a database", "database disk image is malformed", "not a database")


def _read_only(root: pathlib.Path, exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return True
    folder = root if root.exists() else next((p for p in root.parents if p.exists()), root)
    return not os.access(folder, os.W_OK) or (
        (root / "registry.sqlite").exists() and not os.access(root / "registry.sqlite", os.W_OK)
    )


def unusable_registry(root: pathlib.Path, registry: pathlib.Path, exc: Exception) -> Exception:
    """The error to raise when opening `registry` (in workspace `root`) failed with `exc`;
    `exc` itself when it is neither a read-only workspace nor a damaged registry."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    if any(reason in text for reason in _DAMAGED):
        aside = registry.with_name(registry.name + ".damaged")
        return WorkspaceError(
            f"the workspace's record {registry} is damaged ({text.strip()}): it cannot be read "
            f"or written. Move it aside (mv {registry} {aside}) and run the command again: a "
            f"new, empty record is started in {root}; the checkpoints under "
            f"{root / 'experiments'} and in checkpoint storage are untouched, and a run goes "
            "on from one with `lightning-bridge run CONFIG --resume CHECKPOINT_DIR`."
        )
    if (isinstance(exc, OSError) or any(r in text for r in _READ_ONLY)) and _read_only(root, exc):
        return WorkspaceError(
            f"the workspace {root} is read-only: its record ({registry.name}) cannot be "
            "written there. Choose a writable folder with --workspace DIR (or "
            "LIGHTNING_BRIDGE_WORKSPACE), or make this one writable."
        )
    return exc


def record_unreachable(root: pathlib.Path, url: str, exc: Exception) -> WorkspaceError:
    """The error when the record's PostgreSQL server (the workspace's `record` setting) does
    not answer or refuses the connection."""
    inner = getattr(exc, "orig", None) or exc
    first = (str(inner).strip().splitlines() or [""])[0][:300]
    return WorkspaceError(
        f"the experiment record {shown(url)} (set in {root / SETTINGS_FILE}) cannot be "
        f"reached from {socket.gethostname()} ({type(inner).__name__}: {first}); check the "
        "host, port, database, user and password, and that the server runs and accepts "
        "connections from this machine."
    )
