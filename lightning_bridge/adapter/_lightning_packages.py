"""The two names Lightning is published under: `lightning.pytorch` and `pytorch_lightning`.

The same classes ship in the `lightning` package (`lightning.pytorch`) and in the standalone
`pytorch_lightning` package; many tutorials and libraries build on the second. Their classes
are distinct (a `pytorch_lightning.LightningModule` is not a `lightning.pytorch` one), so the
adapter asks here which package a class comes from and uses that package's own classes and
helpers for it. `pytorch_lightning` is only looked at once something imported it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# Module prefix of each package -> the package's import name.
_PACKAGES = {"lightning.pytorch.": "lightning.pytorch", "pytorch_lightning.": "pytorch_lightning"}


def _loaded_packages() -> list[types.ModuleType]:
    return [sys.modules[name] for name in _PACKAGES.values() if name in sys.modules]


def package_of(obj: Any) -> types.ModuleType:
    """The Lightning package (`lightning.pytorch` or `pytorch_lightning`) `obj` is built on."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        for prefix, name in _PACKAGES.items():
            if klass.__module__.startswith(prefix):
                return importlib.import_module(name)
    return importlib.import_module("lightning.pytorch")


def is_a(obj: Any, kind: str) -> bool:
    """Whether `obj` (a class or an instance) is a Lightning `kind` of either package."""
    if isinstance(obj, type):
        return any(issubclass(obj, getattr(pkg, kind)) for pkg in _loaded_packages())
    return any(isinstance(obj, getattr(pkg, kind)) for pkg in _loaded_packages())


def overrides(obj: Any, method: str, kind: str) -> bool:
    """Whether `obj` (class or instance) overrides `kind`'s `method`, in its own package."""
    if obj is None:
        return False
    from lightning_utilities.core.overrides import is_overridden

    return bool(is_overridden(method, obj, getattr(package_of(obj), kind)))


def submodule(package: types.ModuleType, path: str) -> types.ModuleType:
    """`package.path` (e.g. `core.optimizer`) of the given Lightning package."""
    return importlib.import_module(f"{package.__name__}.{path}")
