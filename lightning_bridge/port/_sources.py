"""Port: the user's sources the trial folder copies, and the packages its startup hook installs.

From the modules that define the ported classes, absolute imports are followed to other modules
in the same folder: those are copied unchanged, so the folder is a complete context directory.
Code that is part of an installation is not copied; its distribution goes to the startup hook,
less what installing the bridge brings anyway.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pathlib
import re
import shutil
import sys
import sysconfig

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.port._folder import MODEL_DEF, Loaded

# Names the folder's own files or the bridge take; user code by these names is never copied.
_RESERVED_TOP_LEVEL = {"model_def", "lightning_bridge", "determined"}


def _installed(path: pathlib.Path, distributions: list[str]) -> bool:
    """Whether `path` (a top-level module or package) is part of an installation: the standard
    library, site-packages, or a file an installed distribution of that name recorded (as for
    a ``pip install --target`` folder on ``PYTHONPATH``)."""
    resolved = path.resolve()
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        base = paths.get(key)
        if base and resolved.is_relative_to(pathlib.Path(base).resolve()):
            return True
    if any(part in ("site-packages", "dist-packages") for part in resolved.parts):
        return True
    module_file = resolved / "__init__.py" if resolved.is_dir() else resolved
    for name in distributions:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in files:
            if file.parts[0] == resolved.name and file.name == module_file.name:
                if pathlib.Path(str(file.locate())).resolve() == module_file:
                    return True
    return False


def _top_level_path(name: str) -> pathlib.Path | None:
    module = sys.modules.get(name) or importlib.import_module(name)
    file = getattr(module, "__file__", None)
    if file is not None:
        path = pathlib.Path(file)
        return path.parent if path.name == "__init__.py" else path
    locations = list(getattr(module, "__path__", []))
    return pathlib.Path(locations[0]) if locations else None


def _local_entry(root: pathlib.Path, name: str) -> pathlib.Path | None:
    """root/name.py or the package root/name/, if it is there."""
    if (root / f"{name}.py").is_file():
        return root / f"{name}.py"
    package = root / name
    if package.is_dir() and any(package.glob("*.py")):
        return package
    return None


def _python_files(entry: pathlib.Path) -> list[pathlib.Path]:
    if entry.is_file():
        return [entry]
    return sorted(p for p in entry.rglob("*.py") if "__pycache__" not in p.parts)


def _imported_top_levels(path: pathlib.Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _bridge_requirements() -> set[str]:
    """Distributions that come with `pip install lightning-bridge`."""
    names = {"lightning-bridge", "determined"}
    try:
        requires = importlib.metadata.requires("lightning-bridge") or []
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        requires = []
    for requirement in requires:
        if "extra ==" in requirement:
            continue
        match = re.match(r"[A-Za-z0-9._-]+", requirement)
        if match:
            names.add(_canonical(match.group(0)))
    names.update({"torch", "lightning", "torchmetrics", "numpy", "pytorch-lightning"})
    return names


def _sources(
    loaded: list[Loaded],
) -> tuple[list[tuple[str, pathlib.Path]], list[str]]:
    """The local top-level modules / packages to copy, and the distributions to install.

    Starting from the classes' top-level modules, follow absolute imports to other modules in
    the same folder. Code found in an installation is installed by the startup hook instead.
    """
    distributions = importlib.metadata.packages_distributions()
    provided = _bridge_requirements()
    stdlib = set(sys.stdlib_module_names)
    copies: dict[str, pathlib.Path] = {}
    wanted: set[str] = set()
    queue: list[tuple[str, pathlib.Path | None]] = []
    for item in loaded:
        top = item.module_name.split(".")[0]
        if top in _RESERVED_TOP_LEVEL:
            raise InvalidArgumentError(
                f"{item.spec}: a module named {top!r} clashes with the trial folder's own "
                f"{MODEL_DEF} or the bridge; rename the module."
            )
        entry = _top_level_path(top)
        if entry is None:
            continue
        if _installed(entry, distributions.get(top, [])):
            wanted.update(distributions.get(top, []))
            continue
        queue.append((top, entry.parent))
    seen: set[str] = set()
    while queue:
        name, root = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        assert root is not None
        entry = _local_entry(root, name)
        if entry is None:
            continue
        copies[name] = entry
        for imported in sorted(set().union(*map(_imported_top_levels, _python_files(entry)))):
            if imported in seen or imported in stdlib or imported in _RESERVED_TOP_LEVEL:
                continue
            if _local_entry(root, imported) is not None:
                queue.append((imported, root))
            else:
                wanted.update(distributions.get(imported, []))
    requirements = sorted(
        {d for d in wanted if _canonical(d) not in provided}, key=lambda d: _canonical(d)
    )
    return sorted(copies.items()), requirements


def _copy_source(entry: pathlib.Path, out: pathlib.Path, name: str) -> None:
    destination = out / entry.name
    if destination.resolve() == entry.resolve():
        return  # the folder is written next to the sources: they are there already
    if entry.is_file():
        shutil.copyfile(entry, destination)
        return
    if out.resolve().is_relative_to(entry.resolve()):
        raise InvalidArgumentError(
            f"--out {out} is inside the package {name!r} that port copies into it; write the "
            "trial folder somewhere else."
        )
    shutil.copytree(
        entry,
        destination,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        dirs_exist_ok=True,
    )
