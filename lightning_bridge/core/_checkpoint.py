"""`core_context.checkpoint`: a Core API script's checkpoints, kept in the bridge's
checkpoint storage (a folder per storage id, `metadata.json` written last).

Under `lightning-bridge run` the storage is the config's `checkpoint_storage`, and each
checkpoint goes through the trial's record (`CoreRun.checkpoint`): recorded with its
`steps_completed`, moved into storage, retention applied, as a `Trainer.fit`'s are. With
several processes, `shard=True` makes `store_path` and `upload` collectives: every process
writes into one folder on the checkpoint directory (a folder the trial's nodes share), the
metadata of every process is merged (a key two processes give differently is refused, as on
Determined), and the chief stores the whole."""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
import uuid as uuid_lib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._private import dir_mode, make_dir
from lightning_bridge.checkpoint._storage_backend import COMPLETE_MARK, CheckpointStorage
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.contract._distributed import DistributedContext

if TYPE_CHECKING:
    from lightning_bridge.core._run import CoreRun

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


def storage_section(checkpoint_storage: str | Mapping[str, Any]) -> dict[str, Any]:
    """The `checkpoint_storage` config section a Core API argument names: a path (shared_fs,
    made absolute), an `s3://` or `gs://` URI, or a config section itself."""
    if isinstance(checkpoint_storage, Mapping):
        return dict(checkpoint_storage)
    for scheme, kind in (("s3://", "s3"), ("gs://", "gcs")):
        if checkpoint_storage.startswith(scheme):
            bucket, _, prefix = checkpoint_storage[len(scheme) :].partition("/")
            return {"type": kind, "bucket": bucket, "prefix": prefix or None}
    if "://" in checkpoint_storage:
        raise InvalidArgumentError(
            f"checkpoint_storage={checkpoint_storage!r}: expected a path, an s3:// or gs:// "
            "URI, or a checkpoint_storage config dict."
        )
    path = pathlib.Path(checkpoint_storage).expanduser().resolve()
    return {"type": "shared_fs", "host_path": str(path)}


def storage_from_argument(checkpoint_storage: str | dict[str, Any] | None) -> CheckpointStorage:
    """The storage `core.init(checkpoint_storage=...)` names: a path, an `s3://` or `gs://`
    URI, or a `checkpoint_storage` config dict."""
    if checkpoint_storage is None:
        root = _default_root()
        return storage_from_config({"type": "shared_fs", "host_path": str(root)}, root)
    if not isinstance(checkpoint_storage, (str, dict)):
        raise InvalidArgumentError(
            "core.init(checkpoint_storage=...) takes a path, an s3:// or gs:// URI, a config "
            f"dict or None, not {type(checkpoint_storage).__name__}."
        )
    if isinstance(checkpoint_storage, dict) and checkpoint_storage.get("type") == "shared_fs":
        raise InvalidArgumentError(
            "core.init(checkpoint_storage=...): a shared_fs storage is named by its path "
            "as a string, not a dict (as on Determined)."
        )
    return storage_from_config(storage_section(checkpoint_storage), _default_root())


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

    def __init__(
        self, dist: DistributedContext, storage: CheckpointStorage, run: CoreRun | None = None
    ) -> None:
        self._dist = dist
        self._storage = storage
        self._run = run

    # ----- writing -----

    def _staging(self, storage_id: str | None = None) -> pathlib.Path:
        """A folder to assemble a checkpoint in, beside where it is stored (one rename away);
        under a run, in the trial's checkpoint directory, named by its id (`shard=True`: every
        process finds it)."""
        if self._run is not None:
            parent = self._run.checkpoint_dir
        else:
            local = self._storage.local_path("x")
            parent = local.parent if local is not None else pathlib.Path(tempfile.gettempdir())
        make_dir(parent)  # private to the user (or the sharing group), as every checkpoint
        if storage_id is not None:
            staging = parent / f".core-checkpoint-{storage_id}"
            make_dir(staging)
            return staging
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".core-checkpoint-", dir=parent))
        staging.chmod(dir_mode())
        return staging

    def _publish(self, staging: pathlib.Path, storage_id: str, metadata: dict[str, Any]) -> None:
        """Store a complete checkpoint (the chief): its metadata last, then into storage (and
        the record, under a run)."""
        (staging / COMPLETE_MARK).write_text(json.dumps(metadata, indent=2, default=str))
        if self._run is not None:
            self._run.checkpoint(staging, storage_id, metadata)
        else:
            self._storage.publish(staging, storage_id)
        logger.info("saved checkpoint %s", storage_id)

    def _check_metadata(self, metadata: dict[str, Any] | None) -> dict[str, Any]:
        metadata = dict(metadata or {})
        if self._run is not None and "steps_completed" not in metadata:
            raise ValueError(
                "checkpoint metadata must include 'steps_completed' under lightning-bridge run "
                "(as on a Determined cluster): the batch the checkpoint continues from."
            )
        return metadata

    def _merged_metadata(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Every process's metadata as one (a key given differently is refused)."""
        merged: dict[str, Any] = {}
        conflicts: dict[str, list[int]] = {}
        for rank, theirs in enumerate(self._dist.allgather(metadata)):
            _merge_into(merged, theirs or {}, rank, conflicts, "")
        if conflicts:
            lines = [
                f"    {key} given by ranks {ranks}" for key, ranks in sorted(conflicts.items())
            ]
            raise RuntimeError("refusing to upload with metadata conflicts:\n" + "\n".join(lines))
        return merged

    def _chief_only(self, what: str) -> None:
        if self._dist.rank != 0:
            raise RuntimeError(
                f"cannot call CheckpointContext.{what}(shard=False) from non-chief worker "
                f"(rank={self._dist.rank}); call it on the chief, or with shard=True on every "
                "process."
            )

    @contextlib.contextmanager
    def store_path(
        self, metadata: dict[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """A folder to write a checkpoint into, and its storage id; stored on leaving. With
        `shard=True` every process calls it and writes its own files into the same folder."""
        metadata = self._check_metadata(metadata)
        if not shard:
            self._chief_only("store_path")
            staging = self._staging()
            storage_id = str(uuid_lib.uuid4())
            try:
                yield staging, storage_id
                self._publish(staging, storage_id, metadata)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return
        storage_id = self._dist.broadcast(str(uuid_lib.uuid4()) if self._dist.rank == 0 else None)
        staging = self._staging(storage_id)
        try:
            yield staging, storage_id
            merged = self._merged_metadata(metadata)
            if self._dist.rank == 0:
                self._publish(staging, storage_id, merged)
            self._dist.allgather(None)  # every process waits for the store
        finally:
            if self._dist.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Selector | None = None,
    ) -> str:
        """Copy `ckpt_dir`'s files (those `selector` keeps) into storage; returns the id. With
        `shard=True` every process calls it: each uploads its own files (a folder several
        processes share is uploaded once), and a file two processes give differently is
        refused, as on Determined."""
        metadata = self._check_metadata(metadata)
        if not shard:
            self._chief_only("upload")
            staging = self._staging()
            storage_id = str(uuid_lib.uuid4())
            try:
                if ckpt_dir is not None:
                    # As on Determined, the metadata is written into the source folder too.
                    source = pathlib.Path(ckpt_dir)
                    (source / COMPLETE_MARK).write_text(json.dumps(metadata, indent=2))
                    _copy_selected(source, staging, _files(source, selector))
                self._publish(staging, storage_id, metadata)
                return storage_id
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if selector is not None and ckpt_dir is None:
            raise RuntimeError("ckpt_dir has to be provided if selector is not None")
        storage_id = self._dist.broadcast(str(uuid_lib.uuid4()) if self._dist.rank == 0 else None)
        files: dict[str, str] = {}
        if ckpt_dir is not None:
            source = pathlib.Path(ckpt_dir)
            st = os.stat(source)
            folders = self._dist.allgather((st.st_dev, st.st_ino))
            # A folder several processes name is uploaded by the first of them, unless each
            # selects its own files.
            if selector is not None or folders.index((st.st_dev, st.st_ino)) == self._dist.rank:
                files = {rel.as_posix(): _md5(source / rel) for rel in _files(source, selector)}
        else:
            self._dist.allgather(None)
        everyone = self._dist.allgather(files)
        owners: dict[str, list[int]] = {}
        for rank, theirs in enumerate(everyone):
            for name in theirs:
                owners.setdefault(name, []).append(rank)
        conflicts = {
            name: ranks
            for name, ranks in owners.items()
            if len({everyone[r][name] for r in ranks}) > 1
        }
        if conflicts:
            lines = [f"    {n} uploaded by ranks {r}" for n, r in sorted(conflicts.items())]
            raise RuntimeError("refusing to upload with files conflicts:\n" + "\n".join(lines))
        staging = self._staging(storage_id)
        try:
            mine = [pathlib.Path(n) for n in files if min(owners[n]) == self._dist.rank]
            if ckpt_dir is not None:
                _copy_selected(pathlib.Path(ckpt_dir), staging, mine)
            merged = self._merged_metadata(metadata)
            if self._dist.rank == 0:
                self._publish(staging, storage_id, merged)
            self._dist.allgather(None)
        finally:
            if self._dist.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        return str(storage_id)

    # ----- reading -----

    def _local(self, storage_id: str) -> pathlib.Path | None:
        """The folder a run's `latest_checkpoint` names (the bridge hands the checkpoint to
        continue from as a local folder), or None for a storage id."""
        if self._run is None or os.sep not in str(storage_id):
            return None
        path = pathlib.Path(storage_id)
        return path if (path / COMPLETE_MARK).is_file() else None

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
        local = self._local(storage_id)
        if local is not None:
            _copy_selected(local, dest, _files(local, selector) + [pathlib.Path(COMPLETE_MARK)])
            return
        with tempfile.TemporaryDirectory() as tmp:
            fetched = self._storage.fetch(storage_id, pathlib.Path(tmp) / "ckpt")
            rels = _files(fetched, selector) + [pathlib.Path(COMPLETE_MARK)]
            _copy_selected(fetched, dest, rels)

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
        given = self._local(storage_id)
        if given is not None and selector is None:
            yield given
            return
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
        """Delete a checkpoint from storage (and from the record, under a run)."""
        given = self._local(storage_id)
        storage_id = given.name if given is not None else storage_id
        run = self._run
        if run is not None and run.record is not None:
            run.record.remove(run.checkpoint_dir / storage_id)
            run.record.close()
        else:
            self._storage.delete(storage_id)
        logger.info("deleted checkpoint %s", storage_id)


def _copy_selected(source: pathlib.Path, dest: pathlib.Path, rels: list[pathlib.Path]) -> None:
    for rel in rels:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, dest / rel)


def _md5(path: pathlib.Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _merge_into(
    merged: dict[str, Any],
    theirs: dict[str, Any],
    rank: int,
    conflicts: dict[str, list[int]],
    prefix: str,
) -> None:
    """Merge one process's metadata: nested dicts key by key; a key two processes give
    differently is a conflict (named with its path, and the ranks giving it)."""
    for key, value in theirs.items():
        name = f"{prefix}{key}"
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            _merge_into(merged[key], value, rank, conflicts, f"{name}.")
        elif merged[key] != value:
            conflicts.setdefault(name, [0]).append(rank)
