"""A search trial's own working copy of the experiment folder, as Determined gives each trial.

On Determined every trial runs in a container of its own, on a copy of the context directory:
a `startup-hook.sh` that downloads and unpacks data, or a script writing relative files, never
meets another trial. Here each trial of a search runs its hook and entrypoint in
`<trial folder>/workdir`, a copy made the way Determined makes a context: `.detignore`
honoured, never the workspace, checkpoints or the checkpoint storage, within Determined's size
bound (checked once before the search starts, `_code.check_size`). What `.detignore` leaves
out (data, a virtual environment) and the folder's own links to folders are linked into the
copy rather than left behind, so relative paths to them keep working.

A trial continued (`experiment continue`, a trial given back and run again) reuses its copy:
files the folder still has unchanged are not copied again (size and modification time), the
ones edited since are, and what the trial wrote there stays. A single-trial experiment runs in
the folder itself (`run const.yaml .`, as Determined's local mode), where its outputs were
always written: it has no other trial to meet.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import stat
import time
from collections.abc import Iterable

from lightning_bridge.checkpoint._code import code_files
from lightning_bridge.checkpoint._storage_config import storage_from_config
from lightning_bridge.experiment.config import _plan


@dataclasses.dataclass(frozen=True)
class Synced:
    """What bringing a working copy up to date did."""

    path: pathlib.Path
    copied: int
    unchanged: int
    linked: list[pathlib.Path]
    seconds: float

    def describe(self) -> str:
        text = (
            f"{self.copied} files copied, {self.unchanged} already there, in "
            f"{self.seconds * 1000:.0f} ms"
        )
        if self.linked:
            shown = ", ".join(p.as_posix() for p in self.linked[:5])
            more = f" and {len(self.linked) - 5} more" if len(self.linked) > 5 else ""
            why = ".detignore leaves them out, a link or a cache"
            text += f"; linked, not copied ({why}): {shown}{more}"
        return text


def run_outputs(
    context_dir: pathlib.Path,
    experiment_config: dict[str, object],
    workspace: pathlib.Path,
    *written: pathlib.Path,
) -> list[pathlib.Path]:
    """What a run writes that may lie inside the experiment folder and is never its code: the
    workspace, a local checkpoint storage, `written` (a search's storage file)."""
    skipped = [workspace, *written]
    section = experiment_config.get("checkpoint_storage") or {}
    assert isinstance(section, dict)
    if (section.get("type") or "shared_fs") == "shared_fs":
        storage = storage_from_config(section, context_dir)
        if storage.is_local:
            skipped.append(pathlib.Path(storage.root))
    return skipped


def storage_file(storage: str) -> pathlib.Path | None:
    """A search storage's file (a journal file, SQLite's database), None for a server."""
    if storage.startswith("sqlite:///"):
        return pathlib.Path(storage[len("sqlite:///") :])
    return None if "://" in storage else pathlib.Path(storage)


def _same(source: os.stat_result, target: pathlib.Path) -> bool:
    try:
        there = target.lstat()
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(there.st_mode)
        and there.st_size == source.st_size
        and there.st_mtime_ns == source.st_mtime_ns
    )


def sync(folder: pathlib.Path, dest: pathlib.Path, exclude: Iterable[pathlib.Path] = ()) -> Synced:
    """Make `dest` a working copy of `folder` (or bring an earlier one up to date)."""
    start = time.perf_counter()
    folder = folder.resolve()
    excluded = [p.resolve() for p in exclude]
    ignored: list[pathlib.Path] = []
    files = code_files(folder, [*excluded, dest], ignored)
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for rel in files:
        source, target = folder / rel, dest / rel
        if any(source.parent == p.parent and source.name.startswith(p.name) for p in excluded):
            continue  # a storage file's companions (-wal, .lock)
        try:
            info = source.stat()
        except FileNotFoundError:
            continue  # removed since it was listed
        if _same(info, target):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        shutil.copy2(source, partial)  # a whole file or none: a concurrent reader sees either
        os.replace(partial, target)
        copied += 1
    linked = []
    for rel in ignored:
        target = dest / rel
        if target.is_symlink():
            linked.append(rel)  # linked before
        elif not target.exists():  # (else the trial's own file there: left as it is)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(folder / rel, target)
            linked.append(rel)
    seconds = time.perf_counter() - start
    return Synced(dest, copied, len(files) - copied, linked, seconds)


def prepare_work_dir(plan: _plan.Plan, trial: _plan.TrialRun) -> Synced | None:
    """Make (or bring up to date) a search trial's own copy of the experiment folder, where its
    hook and entrypoint run; None for a single trial, which runs in the folder."""
    if trial.work_dir is None:
        return None
    written = []
    if trial.search is not None:
        found = storage_file(trial.search.storage)
        if found is not None:
            written.append(found)
    skipped = run_outputs(plan.context_dir, plan.experiment_config(), trial.workspace, *written)
    return sync(plan.context_dir, trial.work_dir, skipped)
