"""`core_context.checkpoint`: a Core API script's checkpoints, kept in the bridge's
checkpoint storage (a folder per storage id, `metadata.json` written last)."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import pathlib
import shutil
import tempfile
import uuid as uuid_lib
from collections.abc import Callable, Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._storage_backend import COMPLETE_MARK, CheckpointStorage
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.contract._distributed import DistributedContext

logger = logging.getLogger("lightning_bridge.core")

Selector = Callable[[str], bool]


class DownloadMode(enum.Enum):
    """Whether the processes of a node share one download (one process here: the same)."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def _default_root() -> pathlib.Path:
    """Determined's off-cluster default: the user's data folder, `determined` in it."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return pathlib.Path(base) / "determined"


def storage_from_argument(checkpoint_storage: str | dict[str, Any] | None) -> CheckpointStorage:
    """The storage `core.init(checkpoint_storage=...)` names: a path, an `s3://` or `gs://`
    URI, or a `checkpoint_storage` config dict."""
    if checkpoint_storage is None:
        root = _default_root()
        return storage_from_config({"type": "shared_fs", "host_path": str(root)}, root)
    if isinstance(checkpoint_storage, dict):
        if checkpoint_storage.get("type") == "shared_fs":
            raise InvalidArgumentError(
                "core.init(checkpoint_storage=...): a shared_fs storage is named by its path "
                "as a string, not a dict (as on Determined)."
            )
        return storage_from_config(checkpoint_storage, _default_root())
    if isinstance(checkpoint_storage, str):
        for scheme, kind in (("s3://", "s3"), ("gs://", "gcs")):
            if checkpoint_storage.startswith(scheme):
                bucket, _, prefix = checkpoint_storage[len(scheme) :].partition("/")
                return storage_from_config(
                    {"type": kind, "bucket": bucket, "prefix": prefix or None}, _default_root()
                )
        if "://" in checkpoint_storage:
            raise InvalidArgumentError(
                f"core.init(checkpoint_storage={checkpoint_storage!r}): expected a path, an "
                "s3:// or gs:// URI, or a checkpoint_storage config dict."
            )
        path = pathlib.Path(checkpoint_storage).expanduser()
        return storage_from_config({"type": "shared_fs", "host_path": str(path)}, path)
    raise InvalidArgumentError(
        "core.init(checkpoint_storage=...) takes a path, an s3:// or gs:// URI, a config dict "
        f"or None, not {type(checkpoint_storage).__name__}."
    )


def _files(root: pathlib.Path, selector: Selector | None) -> list[pathlib.Path]:
    found = sorted(p for p in root.rglob("*") if p.is_file())
    rel = [p.relative_to(root) for p in found]
    return [
        r
        for r in rel
        if r.as_posix() != COMPLETE_MARK and (selector is None or selector(r.as_posix()))
    ]


class CheckpointContext:
    """store_path / upload / download / restore_path / get_metadata / delete on one storage."""

    def __init__(self, dist: DistributedContext, storage: CheckpointStorage) -> None:
        self._dist = dist
        self._storage = storage

    def _staging(self) -> pathlib.Path:
        local = self._storage.local_path("x")
        parent = local.parent if local is not None else None
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        return pathlib.Path(tempfile.mkdtemp(prefix=".core-checkpoint-", dir=parent))

    def _publish(self, staging: pathlib.Path, metadata: dict[str, Any] | None) -> str:
        storage_id = str(uuid_lib.uuid4())
        (staging / COMPLETE_MARK).write_text(json.dumps(metadata or {}, indent=2))
        self._storage.publish(staging, storage_id)
        logger.info("saved checkpoint %s", storage_id)
        return storage_id

    def _single_process(self, shard: bool, what: str) -> None:
        if shard or self._dist.size > 1:
            raise NotImplementedError(
                f"checkpoint.{what}(shard=True) and checkpoints from several processes are not "
                "supported by lightning_bridge's Core API yet; store from the chief alone."
            )

    @contextlib.contextmanager
    def store_path(
        self, metadata: dict[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """A folder to write a checkpoint into, and its storage id; stored on leaving."""
        self._single_process(shard, "store_path")
        staging = self._staging()
        storage_id = str(uuid_lib.uuid4())
        try:
            yield staging, storage_id
            (staging / COMPLETE_MARK).write_text(json.dumps(metadata or {}, indent=2))
            self._storage.publish(staging, storage_id)
            logger.info("saved checkpoint %s", storage_id)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Selector | None = None,
    ) -> str:
        """Copy `ckpt_dir`'s files (those `selector` keeps) into storage; returns the id."""
        self._single_process(shard, "upload")
        staging = self._staging()
        try:
            if ckpt_dir is not None:
                # As on Determined, the metadata is written into the source folder too.
                source = pathlib.Path(ckpt_dir)
                (source / COMPLETE_MARK).write_text(json.dumps(metadata or {}, indent=2))
                for rel in _files(source, selector):
                    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source / rel, staging / rel)
            return self._publish(staging, metadata)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> None:
        """Copy a stored checkpoint's files (with its metadata.json) into `ckpt_dir`."""
        dest = pathlib.Path(ckpt_dir)
        with tempfile.TemporaryDirectory() as tmp:
            fetched = self._storage.fetch(storage_id, pathlib.Path(tmp) / "ckpt")
            rels = _files(fetched, selector) + [pathlib.Path(COMPLETE_MARK)]
            for rel in rels:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(fetched / rel, dest / rel)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        with self.restore_path(storage_id) as path:
            data: dict[str, Any] = json.loads((path / COMPLETE_MARK).read_text())
            return data

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> Iterator[pathlib.Path]:
        """The stored checkpoint as a folder (in place on a local storage)."""
        local = self._storage.local_path(storage_id)
        if local is not None and selector is None:
            if not self._storage.is_complete(storage_id):
                raise InvalidArgumentError(
                    f"checkpoint {storage_id} is not in {self._storage.url(storage_id)}."
                )
            yield local
            return
        with tempfile.TemporaryDirectory() as tmp:
            self.download(storage_id, tmp, download_mode, selector=selector)
            yield pathlib.Path(tmp)

    def delete(self, storage_id: str) -> None:
        self._storage.delete(storage_id)
        logger.info("deleted checkpoint %s", storage_id)
