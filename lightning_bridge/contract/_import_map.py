"""Map `import determined` / `determined.pytorch` onto the bridge for unchanged trial code.

`install()` puts a finder on `sys.meta_path` that answers the `determined` modules in
`PROVIDED` with modules holding the bridge's answers to Determined's names:
`determined.pytorch` has exactly Determined's public `pytorch` names (`PYTORCH_NAMES`),
`determined.pytorch.deepspeed` its DeepSpeedTrial names (`DEEPSPEED_NAMES`, trained on
DeepSpeed's engine), the top-level package what scripts read from it (`LOG_FORMAT`,
`get_cluster_info`, `InvalidHP`, `import_from_path`), `determined.core` (with the private
`_context` and `_tensorboard_mode` modules public code imports) the bridge's Core API in
`lightning_bridge.core`, `determined.transformers` its Hugging Face `DetCallback`, and
`determined.util` its `merge_dicts`. Parts of Determined that need its cluster
(`determined.experimental`, batch inference, ...) are refused by name, each with what to do
instead.

`shim_dir()` writes a folder holding a `determined` package that installs the same mapping; on
`PYTHONPATH` it reaches subprocesses (scripts, torchrun workers, Lightning's launcher) and
comes before an installed Determined, whose `pytorch` would otherwise train the script on
Determined instead of Lightning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from typing import Any

PROVIDED = (
    "determined",
    "determined.pytorch",
    "determined.pytorch.samplers",
    "determined.pytorch.deepspeed",
    "determined.core",
    "determined.core._context",
    "determined.core._tensorboard_mode",
    "determined.experimental",
    "determined.experimental.core_v2",
    "determined.lightning",
    "determined.lightning.experimental",
    "determined.launch",
    "determined.launch.wrap_rank",
    "determined.transformers",
    "determined.util",
)

# Where Determined's Core API lives on the bridge (a layer above this one: named, not imported).
_CORE = "lightning_bridge.core"
# Determined's private Core API modules that public code imports, and the bridge's answers.
_CORE_PRIVATE = {
    "determined.core._context": "lightning_bridge.core._context",
    "determined.core._tensorboard_mode": "lightning_bridge.core._tensorboard_mode",
}

# Determined modules answered by a bridge module as it is at each access (`core_v2`'s contexts
# are module attributes that `init()` sets), and the packages that hold only them.
_PROXIED = {
    "determined.experimental.core_v2": "lightning_bridge.core._core_v2",
    "determined.lightning.experimental": "lightning_bridge.core._lightning",
    "determined.transformers": "lightning_bridge.core._transformers",
}
_PARENTS = {
    "determined.experimental": "core_v2",
    "determined.lightning": "experimental",
    "determined.launch": "wrap_rank",
}
# Determined modules run as programs (`python3 -m determined.launch.wrap_rank`): the bridge's
# module file, loaded under Determined's name.
_PROGRAMS = {"determined.launch.wrap_rank": "_wrap_rank.py"}

# Determined's `logging` format (`logging.basicConfig(format=det.LOG_FORMAT)`), the same string.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

# The public names of Determined 0.38.1's `determined.pytorch`, each answered by the bridge's
# own (the bridge's extras, such as `TrialModule` or its error classes, are not among them).
PYTORCH_NAMES = (
    "Batch",
    "CheckpointLoadContext",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchExperimentalContext",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "TorchData",
    "TrainUnit",
    "Trainer",
    "adapt_batch_sampler",
    "data_length",
    "init",
    "load_trial_from_checkpoint_path",
    "samplers",
    "to_device",
)

# The public names of Determined 0.38.1's `determined.pytorch.deepspeed` the bridge answers: the
# trial contract's (`contract/_deepspeed.py`) and the runner's (`Trainer`, `init`).
DEEPSPEED_NAMES = (
    "DeepSpeedTrial",
    "DeepSpeedTrialContext",
    "ModelParallelUnit",
    "Trainer",
    "init",
    "make_data_parallel_mpu",
    "make_deepspeed_mpu",
    "overwrite_deepspeed_config",
)
# Where the runner's names live: a layer above the trial contract, named, not imported.
_DEEPSPEED_RUNNER = "lightning_bridge.translation.deepspeed._trainer"

_CLUSTER = "only on a Determined cluster (`det e create`)"

# Determined's modules (and attributes naming them) the mapping refuses, with the fix.
REFUSED = {
    "determined.experimental": (
        "the Python SDK (client, Determined, Checkpoint, Model) talks to a Determined master; "
        "lightning-bridge keeps experiments, checkpoints and models in its workspace "
        "(`lightning-bridge experiment / checkpoint / model`); determined.experimental.core_v2 "
        "is mapped"
    ),
    "determined.pytorch.experimental": (
        "batch inference (torch_batch_process, TorchBatchProcessor) runs " + _CLUSTER
    ),
    "determined.pytorch.dsat": "DeepSpeed autotuning (dsat) runs " + _CLUSTER,
    "determined.launch": (
        "Determined's launchers (but wrap_rank) are entrypoint words: write `python3 -m "
        "determined.launch.torch_distributed python3 train.py` as the config's entrypoint and "
        "`lightning-bridge run` starts the processes with torchrun (or run `torchrun "
        "--nproc_per_node=N train.py` yourself)"
    ),
    "determined.keras": "TensorFlow trials run " + _CLUSTER,
    "determined.estimator": "TensorFlow trials run " + _CLUSTER,
}


def _refusal(fullname: str) -> str:
    for name, why in REFUSED.items():
        if fullname == name or fullname.startswith(name + "."):
            return f"{fullname} is not mapped onto lightning_bridge: {why}."
    return (
        f"{fullname} is not mapped onto lightning_bridge (it maps {', '.join(PROVIDED)}); code "
        "that needs it runs on Determined itself."
    )


def _with_getattr(module: types.ModuleType, answer: Callable[[str], Any]) -> types.ModuleType:
    setattr(module, "__getattr__", answer)  # noqa: B010 (a module-level __getattr__)
    return module


def _refused_attribute(module: str, attr: str) -> ImportError | AttributeError:
    """The error for `module.attr` when the mapping does not answer it: an ImportError for a
    refused submodule (so `from determined.pytorch import experimental` says why), else an
    AttributeError naming what the mapped module holds."""
    fullname = f"{module}.{attr}"
    if any(fullname == name or fullname.startswith(name + ".") for name in REFUSED):
        return ImportError(_refusal(fullname), name=fullname)
    return AttributeError(
        f"module {module!r} (mapped onto lightning_bridge) has no attribute {attr!r}; "
        f"it holds {', '.join(sorted(n for n in dir(sys.modules.get(module)) if n[0] != '_'))}"
    )


# Where `determined.get_cluster_info` and its classes live: a trial's cluster info is its run
# description, which translation/ reads, a layer above the trial contract. Named, not imported,
# as the package's facade names its public names' modules.
_CLUSTER_INFO = "lightning_bridge.translation.services._cluster_info"


def _build(name: str) -> types.ModuleType:
    from lightning_bridge.contract import _code_import, _samplers

    # The package's facade, which every module of the package is loaded under; it resolves
    # its names (the trainer, the adapter: the layers above this one) on first use.
    lightning_bridge = sys.modules["lightning_bridge"]
    module = types.ModuleType(name, f"Determined's {name}, answered by lightning_bridge.")
    if name == "determined.pytorch.samplers":
        for attr in _samplers.__all__:
            setattr(module, attr, getattr(_samplers, attr))
        module.__all__ = list(_samplers.__all__)  # type: ignore[attr-defined]
        return module
    if name == "determined.pytorch.deepspeed":
        from lightning_bridge.contract import _deepspeed

        def deepspeed_attr(attr: str) -> Any:
            if attr in ("Trainer", "init"):
                value = getattr(importlib.import_module(_DEEPSPEED_RUNNER), attr)
                setattr(module, attr, value)
                return value
            if attr in DEEPSPEED_NAMES:
                return getattr(_deepspeed, attr)
            raise _refused_attribute(name, attr)

        module.__all__ = list(DEEPSPEED_NAMES)  # type: ignore[attr-defined]
        setattr(module, "__dir__", lambda: sorted(DEEPSPEED_NAMES))  # noqa: B010
        return _with_getattr(module, deepspeed_attr)
    if name == "determined.pytorch":

        def pytorch_attr(attr: str) -> Any:
            # The bridge's names load on first use, as `lightning_bridge`'s do.
            if attr in ("samplers", "deepspeed"):
                return importlib.import_module(f"determined.pytorch.{attr}")
            if attr in PYTORCH_NAMES:
                value = getattr(lightning_bridge, attr)
                setattr(module, attr, value)
                return value
            raise _refused_attribute(name, attr)

        module.__all__ = list(PYTORCH_NAMES)  # type: ignore[attr-defined]
        setattr(module, "__dir__", lambda: sorted(PYTORCH_NAMES))  # noqa: B010
        return _with_getattr(module, pytorch_attr)
    if name == "determined.util":
        # Of Determined's helpers, the one its examples import (`hf_trainer_api`'s util.py).
        from lightning_bridge.contract._deepspeed import merge_dicts

        module.merge_dicts = merge_dicts  # type: ignore[attr-defined]
        module.__all__ = ["merge_dicts"]  # type: ignore[attr-defined]

        def util_attr(attr: str) -> Any:
            raise _refused_attribute(name, attr)

        return _with_getattr(module, util_attr)
    if name in _PROXIED:
        source_name = _PROXIED[name]

        def proxied_attr(attr: str) -> Any:
            return getattr(importlib.import_module(source_name), attr)

        module.__all__ = list(  # type: ignore[attr-defined]
            getattr(importlib.import_module(source_name), "__all__", [])
        )
        return _with_getattr(module, proxied_attr)
    if name in _PARENTS:
        child = _PARENTS[name]

        def parent_attr(attr: str) -> Any:
            if attr == child:
                return importlib.import_module(f"{name}.{child}")
            if attr.startswith("__"):
                raise AttributeError(attr)
            raise _refused_attribute(name, attr)

        return _with_getattr(module, parent_attr)
    if name in _CORE_PRIVATE:
        source = importlib.import_module(_CORE_PRIVATE[name])
        for attr in dir(source):
            if not attr.startswith("__"):
                setattr(module, attr, getattr(source, attr))
        return module
    if name == "determined.core":
        core = importlib.import_module(_CORE)
        for attr in core.__all__:
            setattr(module, attr, getattr(core, attr))
        module.__all__ = list(core.__all__)  # type: ignore[attr-defined]

        def core_attr(attr: str) -> Any:
            if f"{name}.{attr}" in PROVIDED:
                return importlib.import_module(f"{name}.{attr}")
            if attr.startswith("__"):
                raise AttributeError(attr)
            raise _refused_attribute(name, attr)

        return _with_getattr(module, core_attr)
    cluster_info = importlib.import_module(_CLUSTER_INFO)
    module.LOG_FORMAT = LOG_FORMAT  # type: ignore[attr-defined]
    module.get_cluster_info = cluster_info.get_cluster_info  # type: ignore[attr-defined]
    module.ClusterInfo = cluster_info.ClusterInfo  # type: ignore[attr-defined]
    module.TrialInfo = cluster_info.TrialInfo  # type: ignore[attr-defined]
    module.InvalidHP = lightning_bridge.InvalidHP  # type: ignore[attr-defined]
    module.import_from_path = _code_import.import_from_path  # type: ignore[attr-defined]

    def determined_attr(attr: str) -> Any:
        # `import determined as det; det.pytorch.init(...)` without importing det.pytorch.
        if f"determined.{attr}" in PROVIDED:
            return importlib.import_module(f"determined.{attr}")
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise _refused_attribute(name, attr)

    return _with_getattr(module, determined_attr)


_LEAVES = (
    "determined.pytorch.samplers",
    "determined.pytorch.deepspeed",
    *_CORE_PRIVATE,
    *_PROXIED,
)


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
            raise ModuleNotFoundError(_refusal(fullname), name=fullname)
        if fullname in _PROGRAMS:
            source = pathlib.Path(__file__).with_name(_PROGRAMS[fullname])
            return importlib.util.spec_from_file_location(fullname, source)
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname not in _LEAVES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _build(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is complete when created."""


# Real `determined` modules that `install(force=True)` took out of `sys.modules`.
_DISPLACED: dict[str, types.ModuleType] = {}


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
        _DISPLACED[name] = sys.modules.pop(name)
    sys.meta_path.insert(0, DeterminedFinder())
    return True


def uninstall() -> None:
    """Remove the mapping and the modules it created, and put back the real `determined`
    modules it displaced, so that code imported before keeps sharing their classes."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, DeterminedFinder)]
    for name in [m for m in sys.modules if m == "determined" or m.startswith("determined.")]:
        if not getattr(sys.modules[name], "__file__", None):
            del sys.modules[name]
    sys.modules.update(_DISPLACED)
    _DISPLACED.clear()


_SHIM = '''"""determined, mapped onto lightning_bridge by `lightning-bridge run`."""
import sys

from lightning_bridge.contract import _import_map

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
