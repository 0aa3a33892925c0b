"""Checkpoint storage: where complete checkpoints live, local or in an object store.

A checkpoint is always written locally first, whole or not at all (`_layout`). `publish` then
moves it into storage: on the same file system a rename; elsewhere (another disk, S3, GCS,
Azure through fsspec's s3fs / gcsfs / adlfs) every file is uploaded and `metadata.json` goes
last. A checkpoint in storage is complete exactly when its `metadata.json` is there, so one
whose upload was killed is never listed or restored from; deleting removes `metadata.json`
first for the same reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import shutil
import uuid as uuid_lib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError
from lightning_bridge.checkpoint._writable import check_writable

COMPLETE_MARK = "metadata.json"  # written last: its presence marks a complete checkpoint


def _copy_tree(source: pathlib.Path, dest: pathlib.Path) -> None:
    """Copy a directory, stopping at the first error with its own OSError (a full disk is
    ENOSPC; `shutil.copytree` would go on and report every file as text)."""
    for folder, _, files in os.walk(source):
        into = dest / pathlib.Path(folder).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copy2(pathlib.Path(folder) / name, into / name)


class CheckpointStorage:
    """Complete checkpoints under `root` of an fsspec file system (`fs`), one folder per uuid.

    `kind` is the `checkpoint_storage.type` it came from. A local storage (`is_local`) holds
    checkpoints as directories a run reads in place; a remote one is downloaded first.
    """

    def __init__(self, kind: str, fs: Any, root: str, scheme: str = "") -> None:
        self.kind = kind
        self.fs = fs
        self.root = root.rstrip("/")
        self._scheme = scheme

    @property
    def is_local(self) -> bool:
        return not self._scheme

    def path(self, uuid: str) -> str:
        return f"{self.root}/{uuid}"

    def url(self, uuid: str) -> str:
        """Where the checkpoint is, as a user would name it (a path, or s3://bucket/...)."""
        return f"{self._scheme}{self.path(uuid)}"

    def local_path(self, uuid: str) -> pathlib.Path | None:
        return pathlib.Path(self.path(uuid)) if self.is_local else None

    # ----- writing -----

    def publish(self, local: pathlib.Path, uuid: str) -> str:
        """Move the complete checkpoint directory `local` into storage as `uuid`; returns its
        URL. Afterwards `local` is gone (unless it already is the stored copy)."""
        if self.is_local:
            self._publish_local(local, pathlib.Path(self.path(uuid)))
        else:
            self._upload(local, self.path(uuid))
            shutil.rmtree(local, ignore_errors=True)
        return self.url(uuid)

    def _publish_local(self, local: pathlib.Path, target: pathlib.Path) -> None:
        if local.resolve() == target.resolve():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(local, target)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        # Another file system: copy beside the target, then rename into place.
        partial = target.parent / f".{target.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            _copy_tree(local, partial)
            os.replace(partial, target)
        except OSError:  # a full disk: nothing half-copied stays in storage
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(local, ignore_errors=True)

    def _upload(self, local: pathlib.Path, remote: str) -> None:
        files = sorted(
            (p for p in local.rglob("*") if p.is_file()),
            key=lambda p: (p.name == COMPLETE_MARK, p.stat().st_size, str(p)),
        )
        if not files or files[-1].name != COMPLETE_MARK:
            raise InvalidCheckpointError(
                f"{local} is not a complete checkpoint (no {COMPLETE_MARK})"
            )
        for file in files:
            self.fs.put_file(str(file), f"{remote}/{file.relative_to(local).as_posix()}")

    def delete(self, uuid: str) -> None:
        """Remove a checkpoint (its completion mark first)."""
        path = self.path(uuid)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(f"{path}/{COMPLETE_MARK}")
        with contextlib.suppress(FileNotFoundError):
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        if not self.is_local:
            self.fs.invalidate_cache(self.root)

    # ----- reading -----

    def is_complete(self, uuid: str) -> bool:
        if not self.is_local:
            self.fs.invalidate_cache(self.path(uuid))
        return bool(self.fs.exists(f"{self.path(uuid)}/{COMPLETE_MARK}"))

    def list_complete(self) -> list[str]:
        """The uuids of the complete checkpoints in storage."""
        if not self.is_local:
            self.fs.invalidate_cache(self.root)
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=False):
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith(".") and self.is_complete(name):
                found.append(name)
        return sorted(found)

    def fetch(self, uuid: str, dest: pathlib.Path) -> pathlib.Path:
        """Copy the complete checkpoint `uuid` into the new directory `dest` (written beside
        and renamed, so `dest` is whole or absent)."""
        if not self.is_complete(uuid):
            raise InvalidCheckpointError(
                f"checkpoint {uuid} is not complete in {self.url(uuid)} (its upload did not "
                "finish, or it was deleted); use another checkpoint."
            )
        if dest.exists() and any(dest.iterdir()):
            raise InvalidArgumentError(f"{dest} is not empty; choose a new directory.")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.parent / f".{dest.name}.{uuid_lib.uuid4().hex[:8]}.partial"
        try:
            if self.is_local:
                shutil.copytree(self.path(uuid), partial)
            else:
                self.fs.get(f"{self.path(uuid)}/", f"{partial}/", recursive=True)
            if not (partial / COMPLETE_MARK).is_file():
                raise InvalidCheckpointError(f"{self.url(uuid)} changed while downloading it")
            if dest.exists():
                dest.rmdir()
            os.replace(partial, dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return dest

    def probe(self) -> None:
        """Write and delete a small object: bad credentials or a missing bucket fail here,
        before any training, with the storage named."""
        if self.is_local:  # a folder: the reason in words (a file, a symlink loop, read-only)
            check_writable(pathlib.Path(self.root))
            return
        name = f"{self.root}/.lightning-bridge-probe-{uuid_lib.uuid4().hex}"
        try:
            self.fs.pipe_file(name, b"probe")
            self.fs.rm_file(name)
        except Exception as exc:  # noqa: BLE001 - every back end raises its own errors
            raise InvalidArgumentError(
                f"checkpoint_storage ({self.kind}): cannot write to {self._scheme}{self.root}: "
                f"{type(exc).__name__}: {str(exc)[:300]}; check the bucket or path and the "
                "credentials."
            ) from None

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.kind!r}, {self._scheme}{self.root!r})"
