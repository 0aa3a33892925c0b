"""Who may read what the bridge writes: its user alone, by default, or the user's group.

A workspace holds an experiment's config with its secrets (the storage's keys, tokens among
the environment variables), and checkpoints hold the model. Folders the bridge creates
(a workspace, a checkpoint storage folder, each checkpoint) are 0700 and the files it writes
that can hold a secret (the registry, a trial's `run.json`, the MLflow link, Slurm job files,
a search's storage file) are created 0600: with the mode, never loosened afterwards, so no
other user can open one between its creation and a `chmod`.

`LIGHTNING_BRIDGE_SHARE_GROUP=1` shares them with the group instead: folders 2770 (setgid, so
what is created inside keeps the folder's group) and files 0660, whatever the umask. The group
is then the folder's: create the workspace's parent with the team's group, or `chgrp` it.
Folders and files that already exist keep their mode.
"""

from __future__ import annotations

import os
import pathlib

SHARE_ENV = "LIGHTNING_BRIDGE_SHARE_GROUP"


def group_shared() -> bool:
    """Whether what the bridge creates is shared with the user's group (`SHARE_ENV`)."""
    return os.environ.get(SHARE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def dir_mode() -> int:
    """The mode of a folder the bridge creates."""
    return 0o2770 if group_shared() else 0o700


def file_mode() -> int:
    """The mode of a file the bridge creates that can hold a secret."""
    return 0o660 if group_shared() else 0o600


def make_dir(path: pathlib.Path) -> None:
    """Create the folder `path` with `dir_mode()` (its missing parents as usual); an
    existing folder is left as it is."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=dir_mode())
    except FileExistsError:
        return
    if group_shared():  # the umask takes the group's write bit and setgid off mkdir's mode
        os.chmod(path, dir_mode())


def create_file(path: pathlib.Path) -> None:
    """Create the empty file `path` with `file_mode()` unless it exists (before a library,
    e.g. SQLite, opens it with its own default mode)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
    except FileExistsError:
        return
    try:
        if group_shared():
            os.fchmod(fd, file_mode())
    finally:
        os.close(fd)


def write_file(path: pathlib.Path, data: str | bytes) -> None:
    """Write `path` whole (a reader never sees half of it), created with `file_mode()`."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:  # a partial file left behind keeps its mode: made anew
        os.unlink(partial)
    except FileNotFoundError:
        pass
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
    with os.fdopen(fd, "wb") as f:
        if group_shared():
            os.fchmod(fd, file_mode())
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(partial, path)
