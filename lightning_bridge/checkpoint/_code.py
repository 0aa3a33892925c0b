"""The experiment folder's copy in a checkpoint's `code/`, as Determined keeps it.

With the code beside the weights, `load_trial_from_checkpoint_path(path)` imports the trial
class from the checkpoint on any machine. The copy honours `.detignore` (gitignore patterns,
plus the bytecode Determined always leaves out) and, whatever `.detignore` says, never holds
what a run writes: a workspace (a folder with a registry), checkpoints (folders with a
checkpoint's files, also half-written ones) and the folders the caller names (the checkpoint
storage, the trial's logs); nor a folder tagged as a cache (a `CACHEDIR.TAG` file, as nox,
pytest, mypy and ruff tag theirs: the convention backup tools honour), which holds no code and
can hold a hundred thousand files that `init()` would otherwise list in the working directory.
Determined copies the context as it was submitted; here the files are listed once when the run
starts (`snapshot`), so what the run writes later into the folder
(a search journal, files the trial writes) is not code either.

The copy is capped like Determined's context upload (95 MB): `check_size` refuses a larger
folder before training with its largest entries named; `copy_code` called over the cap
(a fit of the Python API) copies nothing and warns once with the same list.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
from collections.abc import Iterable

import pathspec

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._secrets import redact_config_file

logger = logging.getLogger("lightning_bridge")

CODE_DIR = "code"
MAX_CODE_BYTES = 95 * 1024 * 1024  # Determined's limit for an experiment's context folder
_ALWAYS_IGNORED = ["__pycache__/", "*.py[co]", "*$py.class", ".detignore"]
# A folder holding one of these is a workspace (its registry, any version of its name).
_WORKSPACE_MARKS = ("registry.sqlite",)
# A folder holding these is a checkpoint (Determined's layout, complete or not).
_CHECKPOINT_MARKS = ("state_dict.pth", "trial_state.pkl", "load_data.json")
# The Cache Directory Tagging Specification's file and the signature it starts with.
_CACHE_TAG = "CACHEDIR.TAG"
_CACHE_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
_warned: set[pathlib.Path] = set()
_snapshots: dict[pathlib.Path, list[pathlib.Path]] = {}


def _spec(root: pathlib.Path) -> pathspec.PathSpec:
    lines = list(_ALWAYS_IGNORED)
    ignore_file = root / ".detignore"
    if ignore_file.is_file():
        lines += ignore_file.read_text().splitlines()
    return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def is_run_output(folder: pathlib.Path) -> bool:
    """Whether `folder` is something a run writes: a workspace, a checkpoint, a partial save."""
    if folder.name.endswith(".partial") and folder.name.startswith("."):
        return True
    try:
        names = set(os.listdir(folder))
    except OSError:
        return False
    checkpoint = "metadata.json" in names and any(m in names for m in _CHECKPOINT_MARKS)
    return checkpoint or bool(names.intersection(_WORKSPACE_MARKS))


def is_cache(folder: pathlib.Path) -> bool:
    """Whether `folder` is tagged as a cache (`CACHEDIR.TAG` with the specification's
    signature)."""
    try:
        with open(folder / _CACHE_TAG, "rb") as tag:
            return tag.read(len(_CACHE_SIGNATURE)) == _CACHE_SIGNATURE
    except OSError:
        return False


def code_files(
    root: pathlib.Path,
    exclude: Iterable[pathlib.Path] = (),
    ignored: list[pathlib.Path] | None = None,
) -> list[pathlib.Path]:
    """The files of `root` a checkpoint's `code/` holds, relative to `root`. `ignored`, when
    given, receives the entries a working copy links rather than copies: what `.detignore`
    itself leaves out (the topmost ones: a folder, not its files) and linked folders, never a
    run's output, an excluded path or bytecode; a cache folder is linked."""
    root = root.resolve()
    skipped = {p.resolve() for p in exclude}
    spec = _spec(root)
    always = pathspec.PathSpec.from_lines("gitwildmatch", _ALWAYS_IGNORED)
    files: list[pathlib.Path] = []
    # The walk does not follow linked folders, so a path under the resolved root is its own
    # real path but for a linked file: only those are resolved to compare with `skipped`.
    for parent, dirs, names in os.walk(root):
        here = pathlib.Path(parent)
        rel_dir = here.relative_to(root)
        kept = []
        for d in sorted(dirs):
            pattern = f"{(rel_dir / d).as_posix()}/"
            path = here / d
            linked = path.is_symlink()
            if (path.resolve() if linked else path) in skipped or is_run_output(path):
                continue
            if linked or is_cache(path):  # linked (data elsewhere) or a cache: never walked
                if ignored is not None and not always.match_file(pattern):
                    ignored.append(rel_dir / d)
            elif not spec.match_file(pattern):
                kept.append(d)
            elif ignored is not None and not always.match_file(pattern):
                ignored.append(rel_dir / d)
        dirs[:] = kept
        for name in sorted(names):
            rel = rel_dir / name
            path = here / name
            if not path.is_file() or (path.resolve() if path.is_symlink() else path) in skipped:
                continue
            if not spec.match_file(rel.as_posix()):
                files.append(rel)
            elif ignored is not None and not always.match_file(rel.as_posix()):
                ignored.append(rel)
    return files


def snapshot(root: pathlib.Path, exclude: Iterable[pathlib.Path] = ()) -> list[pathlib.Path]:
    """List `root`'s code files now (a run starts): later copies take only these."""
    files = code_files(root, exclude)
    _snapshots[root.resolve()] = files
    return files


def _size(root: pathlib.Path, files: Iterable[pathlib.Path]) -> int:
    total = 0
    for rel in files:
        try:
            total += (root / rel).stat().st_size
        except OSError:
            pass
    return total


def largest_entries(root: pathlib.Path, files: list[pathlib.Path], count: int = 5) -> str:
    """The top-level entries of `root` holding most of `files`, largest first, as text."""
    sizes: dict[str, int] = {}
    for rel in files:
        top = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        sizes[top] = sizes.get(top, 0) + _size(root, [rel])
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{name} ({_shown(size)})" for name, size in ranked)


def _shown(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def check_size(
    root: pathlib.Path, exclude: Iterable[pathlib.Path] = (), max_bytes: int = MAX_CODE_BYTES
) -> list[pathlib.Path]:
    """`root`'s code files (and their snapshot), or one message when they exceed
    `max_bytes`: what every checkpoint would copy, with the largest entries named."""
    files = snapshot(root, exclude)
    size = _size(root, files)
    if size > max_bytes:
        raise InvalidArgumentError(
            f"the experiment folder {root} holds {size / 2**20:.1f} MiB of files (after "
            f".detignore), over the {max_bytes / 2**20:.0f} MiB every checkpoint copies into "
            f"code/ (Determined's limit for a context directory); the largest: "
            f"{largest_entries(root, files)}. List data and outputs in {root / '.detignore'} "
            "(gitignore patterns), or move them out of the folder."
        )
    return files


def copy_code(
    root: pathlib.Path,
    dest: pathlib.Path,
    exclude: Iterable[pathlib.Path] = (),
    max_bytes: int = MAX_CODE_BYTES,
    secrets: list[str] | None = None,
) -> bool:
    """Copy `root`'s code files into `dest`; False (and one warning) when over `max_bytes`.
    A file holding one of `secrets` (the config's secret values) is copied with them masked
    (`_secrets.redact_config_file`): a checkpoint is shared, its config is not."""
    exclude = [p.resolve() for p in exclude]
    listed = _snapshots.get(root.resolve())
    if listed is not None and root.resolve() in _warned:
        # The run's files were over the bound at an earlier checkpoint, and its listing only
        # shrinks: no checkpoint of the run carries code/ (and none walks the folder again).
        return False
    if listed is None:
        files = code_files(root, exclude)
    else:  # the files of the run's start that are still there and still code
        files = [
            rel
            for rel in listed
            if (root / rel).is_file()
            and not any((root / rel).resolve().is_relative_to(p) for p in exclude)
        ]
    size = _size(root, files)
    if size > max_bytes:
        if root.resolve() not in _warned:
            _warned.add(root.resolve())
            logger.warning(
                "The experiment folder %s holds %.1f MiB of files (after .detignore), over the "
                "%.0f MiB a checkpoint's code/ copy may take (the largest: %s): checkpoints "
                "carry no code/, so load them with load_trial_from_checkpoint_path(path, "
                "trial_class=MyTrial). List data, outputs and other large files in a .detignore "
                "file to include the code.",
                root,
                size / 2**20,
                max_bytes / 2**20,
                largest_entries(root, files),
            )
        return False
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if secrets:
            data = (root / rel).read_bytes()
            shown = redact_config_file(data, secrets)
            if shown != data:
                target.write_bytes(shown)
                continue
        shutil.copy2(root / rel, target)
    dest.mkdir(parents=True, exist_ok=True)
    return True
