"""The experiment folder's copy in a checkpoint's `code/`, as Determined keeps it.

With the code beside the weights, `load_trial_from_checkpoint_path(path)` imports the trial
class from the checkpoint on any machine. The copy honours `.detignore` (gitignore patterns,
plus the bytecode Determined always leaves out), skips what the run itself writes there
(checkpoints, logs), and is capped like Determined's context upload: a larger folder is not
copied, with one warning that says how to shrink it.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
from collections.abc import Iterable

import pathspec

logger = logging.getLogger("lightning_bridge")

CODE_DIR = "code"
MAX_CODE_BYTES = 95 * 1024 * 1024  # Determined's limit for an experiment's context folder
_ALWAYS_IGNORED = ["__pycache__/", "*.py[co]", "*$py.class", ".detignore"]
_warned: set[pathlib.Path] = set()


def _spec(root: pathlib.Path) -> pathspec.PathSpec:
    lines = list(_ALWAYS_IGNORED)
    ignore_file = root / ".detignore"
    if ignore_file.is_file():
        lines += ignore_file.read_text().splitlines()
    return pathspec.PathSpec.from_lines("gitwildmatch", lines)


def code_files(root: pathlib.Path, exclude: Iterable[pathlib.Path] = ()) -> list[pathlib.Path]:
    """The files of `root` a checkpoint's `code/` holds, relative to `root`."""
    root = root.resolve()
    skipped = {p.resolve() for p in exclude}
    spec = _spec(root)
    files: list[pathlib.Path] = []
    for parent, dirs, names in os.walk(root):
        here = pathlib.Path(parent)
        rel_dir = here.relative_to(root)
        dirs[:] = sorted(
            d
            for d in dirs
            if (here / d).resolve() not in skipped
            and not spec.match_file(f"{(rel_dir / d).as_posix()}/")
        )
        for name in sorted(names):
            rel = rel_dir / name
            if not spec.match_file(rel.as_posix()) and (here / name).is_file():
                files.append(rel)
    return files


def copy_code(
    root: pathlib.Path,
    dest: pathlib.Path,
    exclude: Iterable[pathlib.Path] = (),
    max_bytes: int = MAX_CODE_BYTES,
) -> bool:
    """Copy `root`'s code files into `dest`; False (and one warning) when over `max_bytes`."""
    files = code_files(root, exclude)
    size = sum((root / f).stat().st_size for f in files)
    if size > max_bytes:
        if root.resolve() not in _warned:
            _warned.add(root.resolve())
            logger.warning(
                "The experiment folder %s holds %.1f MiB of files (after .detignore), over the "
                "%.0f MiB a checkpoint's code/ copy may take: checkpoints carry no code/, so "
                "load them with load_trial_from_checkpoint_path(path, trial_class=MyTrial). List "
                "data, outputs and other large files in a .detignore file to include the code.",
                root,
                size / 2**20,
                max_bytes / 2**20,
            )
        return False
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    dest.mkdir(parents=True, exist_ok=True)
    return True
