"""Importing a trial class by its `module:Class` spec, from a checkpoint's own `code/` folder.

Checkpoints carry a copy of the experiment folder in `code/`; the class that wrote them is
imported from there, as Determined does, without leaving the folder on `sys.path` or its
modules in `sys.modules` afterwards (the imported class stays usable), without writing
bytecode into the checkpoint, and without a same-named module imported earlier (the user's
current `model_def`) shadowing the checkpoint's.

Trial code written for Determined imports `determined`; where Determined is not installed, the
caller's `map_determined` (the loader passes `_import_map.install`, as `lightning-bridge run`
maps it) runs once and the import is retried.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from lightning_bridge._errors import InvalidCheckpointError


def _from_dir(module: Any, folder: pathlib.Path) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and pathlib.Path(file).resolve().is_relative_to(folder)


@contextlib.contextmanager
def code_on_path(folder: pathlib.Path, top_module: str) -> Iterator[None]:
    """`folder` first on `sys.path` for the duration, then gone again with its modules."""
    with _on_path(folder.resolve(), {top_module}):
        yield


def _top_level_modules(folder: pathlib.Path) -> set[str]:
    """The modules and packages a folder holds at its top level (the bridge and the
    `determined` it maps are never shadowed)."""
    names = set()
    for entry in folder.iterdir():
        if entry.suffix == ".py" or (entry / "__init__.py").is_file():
            names.add(entry.stem if entry.suffix == ".py" else entry.name)
    return names - {"lightning_bridge", "determined"}


@contextlib.contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Determined's `det.import_from_path`: imports inside the block come from `path` first,
    also where a module of the same name was imported before (a checkpoint's `model_def` beside
    the current one); afterwards `path` and its modules are gone and the earlier ones back."""
    folder = pathlib.Path(path).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"import_from_path: {str(folder)!r} is not a folder")
    with _on_path(folder, _top_level_modules(folder)):
        yield


@contextlib.contextmanager
def without_bytecode() -> Iterator[None]:
    """Imports inside the block write no bytecode: code imported where a user or a checkpoint
    keeps it gets nothing written beside it, whatever PYTHONDONTWRITEBYTECODE says."""
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = saved


@contextlib.contextmanager
def _on_path(folder: pathlib.Path, top_modules: set[str]) -> Iterator[None]:
    shadowing = {
        name: mod
        for name, mod in sys.modules.items()
        if name.partition(".")[0] in top_modules and not _from_dir(mod, folder)
    }
    for name in shadowing:
        del sys.modules[name]
    saved_path = list(sys.path)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        with without_bytecode():
            yield
    finally:
        sys.path[:] = saved_path
        for name in [n for n, m in sys.modules.items() if _from_dir(m, folder)]:
            del sys.modules[name]
        sys.modules.update(shadowing)


def _resolve(spec: str) -> type:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _needs_determined(exc: ImportError) -> bool:
    name = getattr(exc, "name", None) or ""
    return name == "determined" or name.startswith("determined.")


def import_trial_class(
    spec: str, code_dir: pathlib.Path | None, map_determined: Callable[[], bool] | None = None
) -> type:
    """The class named by `spec` ("module:Class"), from `code_dir` when it exists.

    Where its module imports a `determined` that cannot be imported, `map_determined()` is
    called and, when it says the mapping is in place, the import retried."""
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname or "<locals>" in qualname or module_name == "__main__":
        raise InvalidCheckpointError(
            f"The checkpoint's trial class {spec!r} cannot be imported by name (it was defined "
            "in a script or a function); pass it with "
            "load_trial_from_checkpoint_path(path, trial_class=MyTrial)."
        )
    scope: Any = (
        code_on_path(code_dir, module_name.partition(".")[0])
        if code_dir is not None and code_dir.is_dir()
        else contextlib.nullcontext()
    )
    try:
        with scope:
            try:
                return _resolve(spec)
            except ImportError as exc:
                if not _needs_determined(exc) or map_determined is None or not map_determined():
                    raise
                return _resolve(spec)
    except (ImportError, AttributeError) as exc:
        where = f" (searched {code_dir} first)" if code_dir is not None else ""
        raise InvalidCheckpointError(
            f"Could not import the checkpoint's trial class {spec!r}{where}: {exc}. Make its "
            "module importable (e.g. add its folder to PYTHONPATH) or pass trial_class=MyTrial."
        ) from None
