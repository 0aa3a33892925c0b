"""Map `import determined` / `determined.pytorch` onto the bridge for unchanged trial code.

`install()` puts a finder on `sys.meta_path` that answers `determined`,
`determined.pytorch` and `determined.pytorch.samplers` with modules holding the bridge's
public names (and `get_cluster_info`, `InvalidHP` on `determined`), so
`from determined import pytorch`, `import determined.pytorch as det_torch` and
`from determined.pytorch import DataLoader` give the bridge's classes. Other `determined.*`
modules (`core`, `experimental`, ...) are not provided and fail with a message saying so.

`shim_dir()` writes a folder holding a `determined` package that installs the same mapping; on
`PYTHONPATH` it reaches subprocesses (scripts, torchrun workers, Lightning's launcher) and
comes before an installed Determined, whose `pytorch` would otherwise train the script on
Determined instead of Lightning.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
import tempfile
import types
from collections.abc import Sequence
from typing import Any

PROVIDED = ("determined", "determined.pytorch", "determined.pytorch.samplers")


def _copy_module(name: str, source: types.ModuleType, names: list[str]) -> types.ModuleType:
    module = types.ModuleType(name, source.__doc__)
    for attr in names:
        try:
            setattr(module, attr, getattr(source, attr))
        except ImportError:
            # The Lightning adapter is imported lazily; Determined's API does not need it.
            continue
    module.__all__ = list(names)  # type: ignore[attr-defined]
    return module


def _build(name: str) -> types.ModuleType:
    import lightning_bridge
    from lightning_bridge import samplers
    from lightning_bridge.translation import _cluster_info

    if name == "determined.pytorch.samplers":
        public = [n for n in vars(samplers) if not n.startswith("_")]
        return _copy_module(name, samplers, getattr(samplers, "__all__", public))
    if name == "determined.pytorch":
        return _copy_module(name, lightning_bridge, list(lightning_bridge.__all__))
    module = types.ModuleType(name, "Determined's API, answered by lightning_bridge.")
    module.get_cluster_info = _cluster_info.get_cluster_info  # type: ignore[attr-defined]
    module.ClusterInfo = _cluster_info.ClusterInfo  # type: ignore[attr-defined]
    module.TrialInfo = _cluster_info.TrialInfo  # type: ignore[attr-defined]
    module.InvalidHP = lightning_bridge.InvalidHP  # type: ignore[attr-defined]

    def __getattr__(attr: str) -> Any:
        # `import determined as det; det.pytorch.init(...)` without importing det.pytorch.
        if attr == "pytorch":
            return importlib.import_module("determined.pytorch")
        raise AttributeError(f"module 'determined' (mapped onto lightning_bridge) has no {attr!r}")

    setattr(module, "__getattr__", __getattr__)  # noqa: B010 (a module-level __getattr__)
    return module


class DeterminedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers the `determined` modules with the bridge's (see the module docstring)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "determined" and not fullname.startswith("determined."):
            return None
        if fullname not in PROVIDED:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: lightning-bridge maps only determined, "
                "determined.pytorch and determined.pytorch.samplers onto the bridge; code "
                f"that needs {fullname} runs on Determined itself.",
                name=fullname,
            )
        return importlib.util.spec_from_loader(
            fullname, self, is_package=fullname != "determined.pytorch.samplers"
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _build(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is complete when created."""


def installed() -> bool:
    return any(isinstance(f, DeterminedFinder) for f in sys.meta_path)


def determined_available() -> bool:
    """Whether a real `determined` package can be imported (the mapping not counted)."""
    if installed():
        return False
    return importlib.util.find_spec("determined") is not None


def install(force: bool = False) -> bool:
    """Map `determined` onto the bridge in this process. Without `force` nothing happens when
    Determined itself is importable; with it, the mapping replaces Determined. Returns whether
    the mapping is in place."""
    if installed():
        return True
    if not force and determined_available():
        return False
    for name in [m for m in sys.modules if m == "determined" or m.startswith("determined.")]:
        del sys.modules[name]
    sys.meta_path.insert(0, DeterminedFinder())
    return True


def uninstall() -> None:
    """Remove the mapping and the modules it created."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, DeterminedFinder)]
    for name in [m for m in sys.modules if m == "determined" or m.startswith("determined.")]:
        if not getattr(sys.modules[name], "__file__", None):
            del sys.modules[name]


_SHIM = '''"""determined, mapped onto lightning_bridge by `lightning-bridge run`."""
import sys

from lightning_bridge.experiment import _import_map

_import_map.install(force=True)
sys.modules[__name__] = _import_map._build_package("determined")
'''


def _build_package(name: str) -> types.ModuleType:
    """The mapped module for `name` as if imported through the finder (the shim's answer)."""
    finder = next(f for f in sys.meta_path if isinstance(f, DeterminedFinder))
    spec = finder.find_spec(name)
    assert spec is not None
    return importlib.util.module_from_spec(spec)


def shim_dir(parent: str | pathlib.Path | None = None) -> pathlib.Path:
    """A new folder holding the `determined` shim package, for `PYTHONPATH`."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="lightning-bridge-shim-", dir=parent))
    (root / "determined").mkdir()
    (root / "determined" / "__init__.py").write_text(_SHIM)
    return root
