"""Whether a checkpoint directory can take checkpoints, and what to say when one fails.

`check_writable` runs before anything trains: it creates the directory if needed and writes
and removes a small file there, so a path that is a file, a symlink loop, read-only or on a
full disk is reported with its reason at once, not after the first training period.
`space_shortfall` compares the free space with a lower bound of one checkpoint's size.
`write_failure` turns an error of a save into one message: the path, the reason, the space a
checkpoint needs, and that the checkpoints written before are intact.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import stat
import tempfile
from typing import Any

from lightning_bridge._errors import CheckpointWriteError, InvalidArgumentError

_FIX = "point the checkpoint storage (checkpoint_storage.host_path, or checkpoint_dir=) elsewhere"
_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT)


def _reason(path: pathlib.Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link loop"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    if exc.errno == errno.EEXIST and path.is_symlink():
        return f"it is a symbolic link to {os.readlink(path)}, which does not exist"
    if exc.errno == errno.EEXIST:
        return "it exists and is not a directory"
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "this user may not write there (permission denied)"
    if exc.errno in _SPACE_ERRORS:
        return "there is no space left on its file system"
    return exc.strerror or str(exc)


def check_writable(base_dir: pathlib.Path) -> None:
    """Create `base_dir` if needed and check a file can be written there; raise
    InvalidArgumentError naming the path and the reason otherwise."""
    try:
        try:
            if not stat.S_ISDIR(os.stat(base_dir).st_mode):
                raise FileExistsError(errno.EEXIST, "File exists", str(base_dir))
        except FileNotFoundError:
            pass  # created below (unless it is a dangling symbolic link)
        base_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=base_dir)
        try:
            os.write(fd, b"lightning_bridge")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise InvalidArgumentError(
            f"checkpoint directory {base_dir} cannot take checkpoints: {_reason(base_dir, exc)}; "
            f"{_FIX}."
        ) from None


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) payload: a lower bound of its size on disk."""
    import torch  # only where a payload exists, so the checks above load no torch

    def size(node: Any) -> int:
        if isinstance(node, torch.Tensor):
            return node.numel() * node.element_size()
        if isinstance(node, dict):
            return sum(size(v) for v in node.values())
        if isinstance(node, (list, tuple)):
            return sum(size(v) for v in node)
        return 0

    return size(obj)


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover - unreachable


def _free(base_dir: pathlib.Path) -> int | None:
    try:
        return shutil.disk_usage(base_dir).free
    except OSError:
        return None


def space_shortfall(base_dir: pathlib.Path, payload: Any) -> str | None:
    """A message when `base_dir` has less free space than the tensors of a checkpoint's
    `payload` (a lower bound of its size)."""
    needed = tensor_bytes(payload)
    free = _free(base_dir)
    if free is None or free >= needed:
        return None
    return (
        f"checkpoint directory {base_dir} has {_size(free)} free, but a checkpoint of this "
        f"trial needs at least {_size(needed)}; free some space or {_FIX}."
    )


def directory_bytes(path: pathlib.Path) -> int:
    """The bytes of the files under `path` (a checkpoint already written elsewhere)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_failure(
    base_dir: pathlib.Path, exc: OSError, needed: int, latest: pathlib.Path | None = None
) -> CheckpointWriteError:
    """The error for a save into `base_dir` that failed with `exc` (after the partial files
    were removed); `needed`: the bytes a checkpoint takes, `latest`: the newest complete one."""
    where = base_dir  # the file that failed, when it is one of the checkpoint directory's
    if exc.filename and pathlib.Path(exc.filename).is_relative_to(base_dir):
        where = pathlib.Path(exc.filename)
    message = f"could not write a checkpoint to {where}: {_reason(where, exc)}"
    if exc.errno in _SPACE_ERRORS:
        free = _free(base_dir)
        message += f"; a checkpoint needs about {_size(needed)}"
        if free is not None:
            message += f" and {_size(free)} are free"
    elif exc.errno == errno.EFBIG:
        message = (
            f"could not write a checkpoint to {where}: a file would exceed this process's "
            f"file size limit (ulimit -f); a checkpoint needs about {_size(needed)}"
        )
    intact = f" (the latest is {latest})" if latest is not None else ""
    return CheckpointWriteError(
        f"{message}. The checkpoints written before are intact{intact}; make room or "
        f"{_FIX}, then continue from the latest checkpoint."
    )
