"""Checkpoints in Determined's directory layout, written whole or not at all.

A checkpoint is a directory `<checkpoint dir>/<uuid>` holding `state_dict.pth` (the payload:
models, optimizers, LR schedulers, callbacks, RNG states), `trial_state.pkl` (progress
counters), `load_data.json` (how to rebuild the trial) and `metadata.json`. It is written to a
temporary sibling directory, flushed to disk and renamed into place; only then does the
`latest` pointer name it, so a reader never sees a partial checkpoint. What goes into the
payload is the translation layer's business; this module writes and finds directories.
`TrialState` is what `trial_state.pkl` holds: the trial's progress counters.

`state_dict.pth` is written by `save_state`: `torch.save` without the per-record CRC32 that
loading never checks. `torch.save` computes a CRC32 over every record it writes (every tensor's
bytes), which costs more than writing them; `torch.load` never verifies it (torch builds its
zip reader with `MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS`, so a flipped byte loads silently
either way), and the file stays a valid torch checkpoint that every loader reads. Only zip
tools that test archives (`unzip -t`) notice the missing checksums. torch switches the CRC with
a process-wide setting read when a save opens its file; it is switched off around this save
only (saves here are serialized by a lock) and restored afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import pickle
import shutil
import threading
import uuid as uuid_lib
from typing import IO, Any

import torch

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._private import dir_mode, group_shared, make_dir
from lightning_bridge._version import __version__
from lightning_bridge.checkpoint._code import CODE_DIR, copy_code
from lightning_bridge.checkpoint._writable import tensor_bytes, write_failure

logger = logging.getLogger("lightning_bridge")

STATE_FILE = "state_dict.pth"
EXTRAS_KEY = "lightning_bridge"  # the bridge's own entry in state_dict.pth
LATEST_FILE = "latest"  # names the newest complete checkpoint in a checkpoint directory
FORMAT_VERSION = 1  # metadata.json "lightning_bridge_format"; bumped on incompatible changes
# metadata.json "determined_version": the Determined release whose checkpoints these match.
DETERMINED_VERSION = "0.38.1"
LEGACY_STATE_FILES = (
    ("state_dict.pth",),
    ("determined", "state_dict.pth"),
    ("pedl", "state_dict.pth"),
    ("checkpoint.pt",),
)


@dataclasses.dataclass
class TrialState:
    """Batches and epochs trained, and the batch counts of the last checkpoint and validation."""

    trial_id: int = 0
    last_ckpt: int = 0
    step_id: int = 0
    last_val: int = 0
    batches_trained: int = 0
    epochs_trained: int = 0

    @property
    def checkpoint_is_current(self) -> bool:
        return self.last_ckpt == self.batches_trained

    @property
    def validation_is_current(self) -> bool:
        return self.last_val == self.batches_trained

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialState:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in fields and v is not None})


_LOCK = threading.Lock()


def save_state(obj: Any, path: str | os.PathLike[str] | IO[bytes]) -> None:
    """`torch.save(obj, path)` (a path or a binary file) without per-record CRC32s (see the
    module docstring)."""
    serialization: Any = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):  # torch without the switch
        torch.save(obj, path)
        return
    with _LOCK:
        previous = serialization.get_crc32_options()
        serialization.set_crc32_options(False)
        try:
            torch.save(obj, path)
        finally:
            serialization.set_crc32_options(previous)


def _fsync_tree(root: pathlib.Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_latest(base_dir: pathlib.Path, storage_id: str) -> None:
    """Point `latest` at a complete checkpoint (written beside, then renamed over)."""
    tmp = base_dir / f".{LATEST_FILE}.{storage_id}"
    with open(tmp, "w") as f:
        f.write(storage_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, base_dir / LATEST_FILE)
    _fsync_dir(base_dir)


def resolve_checkpoint(
    value: str | os.PathLike[str], ckpt_dir: pathlib.Path, option: str = "latest_checkpoint"
) -> pathlib.Path:
    """A checkpoint given as a directory path, a checkpoint id under the checkpoint dir, or
    "latest" (the newest complete checkpoint there). `option` names the argument in the
    message when there is no checkpoint yet."""
    path = pathlib.Path(value)
    if str(value) == LATEST_FILE and not path.is_dir():
        latest = latest_checkpoint_in(ckpt_dir)
        if latest is None:
            raise InvalidArgumentError(
                f"{option}='latest' but {ckpt_dir} holds no checkpoint yet; train without "
                f"{option} first."
            )
        return latest
    if not path.is_dir() and (ckpt_dir / path).is_dir():
        return ckpt_dir / path
    return path


def _pointer_target(base_dir: pathlib.Path, pointer: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint `latest` names: a directory name of `base_dir`, else None (a damaged
    pointer is skipped with a warning; the newest complete checkpoint is used instead)."""
    try:
        name = pointer.read_bytes()[:256].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        logger.warning(
            "%s does not name a checkpoint of %s; using the newest complete checkpoint there.",
            pointer,
            base_dir,
        )
        return None
    return base_dir / name


def latest_checkpoint_in(base_dir: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint to continue from in a checkpoint directory, if any.

    `latest` names the last checkpoint written. If a save was interrupted after its directory
    was renamed into place but before `latest` existed, the complete checkpoint with the most
    batches trained is used instead.
    """
    pointer = base_dir / LATEST_FILE
    if pointer.is_file():
        named = _pointer_target(base_dir, pointer)
        if named is not None and (named / "metadata.json").is_file():
            return named

    def steps(path: pathlib.Path) -> int:
        try:
            return int(json.loads((path / "metadata.json").read_text())["steps_completed"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    complete = [
        p
        for p in (base_dir.iterdir() if base_dir.is_dir() else [])
        if p.is_dir() and not p.name.startswith(".") and steps(p) >= 0
    ]
    return max(complete, key=steps) if complete else None


def write_checkpoint(
    base_dir: pathlib.Path,
    payload: dict[str, Any],
    trial_state: dict[str, int],
    load_data: dict[str, Any],
    code_dir: pathlib.Path | None = None,
    code_exclude: tuple[pathlib.Path, ...] = (),
    storage_id: str | None = None,
    code_secrets: list[str] | None = None,
) -> tuple[pathlib.Path, str]:
    """Write one checkpoint under `base_dir/<storage_id>` (a new uuid by default) atomically;
    returns its path and id.

    The files go to `.<uuid>.partial`, are fsynced, and the directory is renamed into place
    before `latest` is moved to it; an interrupted save leaves only the `.partial` directory.
    `code_dir` (the experiment folder) is copied into the checkpoint's `code/` (see `_code`),
    leaving out `base_dir` and `code_exclude`, with `code_secrets` masked in it.
    """
    storage_id = storage_id or str(uuid_lib.uuid4())
    tmp = partial_dir(base_dir, storage_id)
    try:
        make_dir(base_dir)
        tmp.mkdir(mode=dir_mode())
        if group_shared():
            os.chmod(tmp, dir_mode())
        # Through a Python file, so a failed write raises OSError with its errno (a full disk
        # is ENOSPC), not torch's "unexpected pos" RuntimeError.
        with open(tmp / STATE_FILE, "wb") as state_file:
            save_state(payload, state_file)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        latest = latest_checkpoint_in(base_dir)
        raise write_failure(base_dir, exc, tensor_bytes(payload), latest) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = seal_checkpoint(
        base_dir,
        storage_id,
        trial_state,
        load_data,
        code_dir,
        code_exclude,
        tensor_bytes(payload),
        code_secrets,
    )
    return final, storage_id


def partial_dir(base_dir: pathlib.Path, storage_id: str) -> pathlib.Path:
    """Where checkpoint `storage_id`'s files are written before `seal_checkpoint`."""
    return base_dir / f".{storage_id}.partial"


def seal_checkpoint(
    base_dir: pathlib.Path,
    storage_id: str,
    trial_state: dict[str, int],
    load_data: dict[str, Any],
    code_dir: pathlib.Path | None = None,
    code_exclude: tuple[pathlib.Path, ...] = (),
    size: int = 0,
    code_secrets: list[str] | None = None,
) -> pathlib.Path:
    """Complete a checkpoint whose state files are in its `partial_dir` (written by this
    process, or by every process of a sharded save): the progress, load data, metadata and
    code (`code_secrets` masked in it), fsynced, renamed into place, then `latest`. `size`
    (bytes) is named if it fails."""
    final = base_dir / storage_id
    tmp = partial_dir(base_dir, storage_id)
    try:
        with open(tmp / "trial_state.pkl", "wb") as f:
            pickle.dump(trial_state, f)
        with open(tmp / "load_data.json", "w") as f:
            json.dump(load_data, f)
        with open(tmp / "metadata.json", "w") as f:
            json.dump(
                {
                    "lightning_bridge_version": __version__,
                    "steps_completed": trial_state["batches_trained"],
                    "framework": f"torch-{torch.__version__}",
                    "format": "pickle",
                    "lightning_bridge_format": FORMAT_VERSION,
                    "determined_version": DETERMINED_VERSION,
                },
                f,
                indent=2,
            )
        if code_dir is not None:
            copy_code(
                code_dir,
                tmp / CODE_DIR,
                exclude=(base_dir, *code_exclude),
                secrets=code_secrets,
            )
        _fsync_tree(tmp)
        os.replace(tmp, final)
        _fsync_dir(base_dir)
        _write_latest(base_dir, storage_id)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        latest = latest_checkpoint_in(base_dir)
        raise write_failure(base_dir, exc, size, latest) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("Checkpoint %s written to %s", storage_id, final)
    return final
