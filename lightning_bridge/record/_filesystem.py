"""Whether a folder is on a network file system, read from the mounts table (`/proc/mounts`).

SQLite's locking relies on the file system's locks, which NFS, CIFS and the cluster file
systems (Lustre, GPFS, BeeGFS, ...) do not provide reliably, and its WAL mode needs memory
shared by every process that opens the database, which machines do not share: a record that
several machines write is a PostgreSQL server instead (`_settings`).
"""

from __future__ import annotations

import os
import pathlib

_NETWORK = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "glusterfs",
    "fuse.glusterfs",
    "ceph",
    "fuse.ceph",
    "cephfs",
    "afs",
    "panfs",
    "pvfs2",
    "orangefs",
    "9p",
    "fuse.sshfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.juicefs",
    "wekafs",
    "davfs",
    "fuse.davfs2",
}


def _unescape(field: str) -> str:
    """A mount point as /proc/mounts writes it (octal escapes for space, tab, newline, \\)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: pathlib.Path, mounts: str) -> str | None:
    """The type of the file system `path` is on, by the longest mount point above it in
    `mounts` (the text of /proc/mounts); None when no mount point is listed above it."""
    target = os.path.abspath(path)
    best: tuple[int, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fields[2])
    return best[1] if best else None


def network_filesystem(path: pathlib.Path, mounts: str | None = None) -> str | None:
    """The network file system type `path` is on (`nfs4`, `lustre`, ...), else None.
    `mounts`: the mounts table's text (default: this machine's /proc/mounts)."""
    if mounts is None:
        try:
            mounts = pathlib.Path("/proc/mounts").read_text()
        except OSError:
            return None  # no mounts table (not Linux): nothing known
    kind = filesystem_type(path.expanduser().resolve(), mounts)
    if kind is None:
        return None
    return kind if kind in _NETWORK or kind.split(".")[0] in _NETWORK else None
