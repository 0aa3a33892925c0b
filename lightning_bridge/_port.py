"""`lightning-bridge port`: pack a LightningModule (and its DataModule) into a trial folder.

`write_trial_folder("pkg.models:LitModel", out, datamodule="pkg.data:DataModule")` writes a
folder that Determined (`det experiment create const.yaml DIR`) and the bridge's runner
(`lightning-bridge run DIR/const.yaml`) both train unchanged:

- `model_def.py`: the trial, `lightning_trial(LitModel, datamodule=DataModule)` on
  Determined's `PyTorchTrial` where Determined is importable (the bridge's otherwise). It
  imports the user's classes by their import path and holds none of their code.
- `const.yaml`: the constructor arguments of both classes with their default values as
  hyperparameters (`batch_size` as `global_batch_size`), a `single` searcher on the first
  metric `validation_step` logs, a length.
- `startup-hook.sh`: installs the bridge (and the third-party packages the copied sources
  import) in Determined's task container.
- the user's source: the module files / top-level packages of the two classes and the local
  modules they import, copied unchanged, so the folder is a complete context directory. Code
  installed as a distribution is not copied; the startup hook installs it instead.

The first validation metric is found by running it: both classes are built with their
defaults and Lightning validates one batch on the CPU (`Trainer.validate(limit_val_batches=1)`);
the metric names come back in the order `self.log` was first called.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import inspect
import logging
import math
import os
import pathlib
import re
import shutil
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from ._errors import InvalidArgumentError, InvalidTrialError

logger = logging.getLogger("lightning_bridge")

DEFAULT_EPOCHS = 10
EXPERIMENT_SEED = 0
MODEL_DEF = "model_def.py"
CONST_YAML = "const.yaml"
STARTUP_HOOK = "startup-hook.sh"
_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# Names the folder's own files or the bridge take; user code by these names is never copied.
_RESERVED_TOP_LEVEL = {"model_def", "lightning_bridge", "determined"}
# Words in a metric name that mean larger values are better (accuracy, F1, AUC, ...).
_LARGER_IS_BETTER = {
    "acc",
    "accuracy",
    "ap",
    "auc",
    "auroc",
    "bleu",
    "dice",
    "f1",
    "iou",
    "map",
    "precision",
    "r2",
    "recall",
    "rouge",
    "score",
    "top1",
    "top5",
}


@dataclass
class _Loaded:
    """A class named on the command line, with the module it was imported from."""

    spec: str
    cls: type
    module: Any

    @property
    def module_name(self) -> str:
        return str(self.module.__name__)

    @property
    def qualname(self) -> str:
        return self.spec.split(":", 1)[1]


@dataclass
class _Hyperparameters:
    values: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    skipped: list[str] = field(default_factory=list)


def write_trial_folder(
    target: str,
    out: pathlib.Path,
    datamodule: str | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Write the trial folder for `target` (`module:LightningModuleClass`) into `out`.

    `datamodule` (`module:LightningDataModuleClass`) supplies the data when the module has no
    loaders of its own. A non-empty `out` is refused unless `force`, which overwrites the files
    the tool writes and leaves other files alone. Returns `out`.
    """
    out = pathlib.Path(out)
    _check_out(out, force)
    import lightning.pytorch as pl

    with _cwd_on_path():
        module = _load(target, pl.LightningModule, "TARGET", "LightningModule")
        data = (
            _load(datamodule, pl.LightningDataModule, "--datamodule", "LightningDataModule")
            if datamodule is not None
            else None
        )
    hparams = _hyperparameters(module.cls, data.cls if data is not None else None)
    _check_hooks(module, data)
    metrics, loader_batch_size = _probe_validation(module, data)
    if hparams.batch_size is None:
        if loader_batch_size is None:
            raise InvalidTrialError(
                "Could not tell the batch size: neither class has a `batch_size` constructor "
                "argument and the validation DataLoader has no `batch_size`. Add a "
                "`batch_size` argument (with a default) to the class that builds the loaders."
            )
        hparams.batch_size = loader_batch_size

    sources, requirements = _sources([module] + ([data] if data is not None else []))
    command = _command(target, datamodule)
    files = {
        MODEL_DEF: _model_def(module, data),
        CONST_YAML: _const_yaml(module, data, hparams, metrics[0], command),
        STARTUP_HOOK: _startup_hook(requirements),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / STARTUP_HOOK).chmod(0o755)
    for top_level, path in sources:
        _copy_source(path, out, top_level)
    return out


# -- checks -------------------------------------------------------------------------------


def _check_out(out: pathlib.Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {out} is a file; name a directory to write into.")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InvalidArgumentError(
            f"--out {out} is not empty; name a new or empty directory, or pass --force to "
            f"overwrite the files port writes there ({MODEL_DEF}, {CONST_YAML}, "
            f"{STARTUP_HOOK} and the copied sources)."
        )


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    """Import targets from the working directory, as `python -m` would."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _load(spec: str, base: type, option: str, kind: str) -> _Loaded:
    """Import `module:QualName` and check that it is a subclass of `base`."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise InvalidArgumentError(
            f"{option} {spec!r} is not of the form module:Class; write the import path of "
            f"the module, a colon and the class name, e.g. my_project.models:LitClassifier."
        )
    module_name, qualname = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise InvalidArgumentError(
                f"{option} {spec}: no module named {module_name!r} on the import path. Run "
                "port from the folder that holds it (the working directory is searched) or "
                "install its package."
            ) from None
        raise InvalidArgumentError(
            f"{option} {spec}: importing {module_name!r} failed: {exc}. Install what it "
            f"needs, so that `python -c 'import {module_name}'` works."
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure of user code is reported as such
        raise InvalidArgumentError(
            f"{option} {spec}: importing {module_name!r} failed: {type(exc).__name__}: {exc}. "
            f"Fix the module, so that `python -c 'import {module_name}'` works."
        ) from None
    obj: Any = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            found = sorted(
                name
                for name, value in vars(module).items()
                if inspect.isclass(value) and issubclass(value, base) and value is not base
            )
            hint = f" Its {kind} classes: {', '.join(found)}." if found else ""
            raise InvalidArgumentError(
                f"{option} {spec}: module {module_name!r} has no {qualname!r}.{hint}"
            )
        obj = getattr(obj, part)
    if not (inspect.isclass(obj) and issubclass(obj, base)):
        what = f"the class {obj.__name__}" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        raise InvalidTrialError(
            f"{option} {spec} is {what}, not a {kind} subclass; name a class derived from "
            f"lightning.pytorch.{kind}."
        )
    return _Loaded(spec=spec, cls=obj, module=module)


def _overrides(cls: type | None, hook: str, base: type) -> bool:
    return cls is not None and getattr(cls, hook, None) is not getattr(base, hook, None)


def _check_hooks(module: _Loaded, data: _Loaded | None) -> None:
    """The trial trains and validates: refuse a module that cannot do both."""
    import lightning.pytorch as pl

    dm_cls = data.cls if data is not None else None
    if not _overrides(module.cls, "validation_step", pl.LightningModule):
        raise InvalidTrialError(
            f"{module.spec} has no validation_step(); a trial validates, and its searcher "
            "needs a validation metric. Add validation_step() with self.log('val_loss', ...)."
        )
    for hook in ("train_dataloader", "val_dataloader"):
        if not (
            _overrides(module.cls, hook, pl.LightningModule)
            or _overrides(dm_cls, hook, pl.LightningDataModule)
        ):
            where = f"{data.spec} nor {module.spec} defines" if data else f"{module.spec} has no"
            fix = "" if data else " or pass --datamodule module:DataModuleClass"
            raise InvalidTrialError(
                f"{'Neither ' if data else ''}{where} {hook}(); the trial needs training and "
                f"validation loaders. Define {hook}(){fix}."
            )


# -- hyperparameters ----------------------------------------------------------------------


def _yaml_value(value: Any) -> tuple[bool, Any]:
    """(True, value as YAML writes it) for plain data; (False, None) for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        return True, value
    if isinstance(value, float):
        return (True, value) if math.isfinite(value) else (False, None)
    if isinstance(value, (list, tuple)):
        items = [_yaml_value(v) for v in value]
        return (all(ok for ok, _ in items), [v for _, v in items])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        pairs = {k: _yaml_value(v) for k, v in value.items()}
        return (all(ok for ok, _ in pairs.values()), {k: v for k, (_, v) in pairs.items()})
    return False, None


def _constructor_parameters(cls: type) -> list[inspect.Parameter]:
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - a C-level __init__
        return []
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _hyperparameters(module_cls: type, dm_cls: type | None) -> _Hyperparameters:
    """Constructor arguments and their defaults; arguments without one are refused."""
    result = _Hyperparameters()
    module_batch: int | None = None
    for cls in (module_cls, dm_cls):
        if cls is None:
            continue
        params = _constructor_parameters(cls)
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        if required:
            raise InvalidTrialError(
                f"{cls.__name__}.__init__ has arguments without a default value: "
                f"{', '.join(required)}. The trial builds {cls.__name__} from hyperparameters "
                "matched to its arguments by name, and port writes their values from the "
                "defaults: give these arguments defaults, then change the values in "
                f"{CONST_YAML}."
            )
        for p in params:
            ok, value = _yaml_value(p.default)
            if p.name == "batch_size" and isinstance(p.default, int):
                if cls is module_cls:
                    module_batch = p.default
                else:
                    result.batch_size = p.default
                continue
            if not ok:
                result.skipped.append(f"{cls.__name__}.{p.name}")
                continue
            if p.name in result.values and result.values[p.name] != value:
                logger.warning(
                    "%s and %s both take %r with different defaults (%r, %r); the trial gives "
                    "both the value in %s (%r).",
                    module_cls.__name__,
                    cls.__name__,
                    p.name,
                    result.values[p.name],
                    value,
                    CONST_YAML,
                    result.values[p.name],
                )
                continue
            result.values.setdefault(p.name, value)
    if result.batch_size is None:
        result.batch_size = module_batch
    return result


# -- the first validation metric ------------------------------------------------------------


def _probe_validation(module: _Loaded, data: _Loaded | None) -> tuple[list[str], int | None]:
    """Validate one batch with Lightning: the metric names logged, the loader's batch size."""
    import lightning.pytorch as pl

    instances = []
    for loaded in (module, data):
        if loaded is None:
            continue
        try:
            instances.append(loaded.cls())
        except Exception as exc:  # noqa: BLE001 - user code
            raise InvalidTrialError(
                f"{loaded.spec}: building {loaded.cls.__name__}() with its default arguments "
                f"failed: {type(exc).__name__}: {exc}. Port builds it to find the validation "
                "metric; make the defaults work."
            ) from None
    model = instances[0]
    datamodule = instances[1] if data is not None else None

    quiet = ("lightning.pytorch", "lightning.fabric", "lightning")
    levels = {name: logging.getLogger(name).level for name in quiet}
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in quiet:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                limit_val_batches=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=root,
            )
            results = trainer.validate(model, datamodule=datamodule, verbose=False)
        except Exception as exc:  # noqa: BLE001 - user code
            raise InvalidTrialError(
                f"{module.spec}: validating one batch with Lightning failed: "
                f"{type(exc).__name__}: {exc}. Port runs validation_step once to find the "
                "metric to search on; fix the error (try lightning.Trainer(fast_dev_run=True))."
            ) from None
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
        loader = trainer.val_dataloaders
    names = [str(name) for name in (results[0] if results else {})]
    if not names:
        raise InvalidTrialError(
            f"{module.spec}: validation_step logged no metric. The searcher needs one: log it "
            "with self.log('val_loss', loss) in validation_step."
        )
    batch_size = getattr(loader, "batch_size", None)
    return names, batch_size if isinstance(batch_size, int) else None


def _smaller_is_better(metric: str) -> bool:
    words = {w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w}
    return not (words & _LARGER_IS_BETTER)


# -- sources to copy ------------------------------------------------------------------------


def _installed(path: pathlib.Path) -> bool:
    """Whether `path` is part of an installation (site-packages or the standard library)."""
    resolved = path.resolve()
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        base = paths.get(key)
        if base and resolved.is_relative_to(pathlib.Path(base).resolve()):
            return True
    return any(part in ("site-packages", "dist-packages") for part in resolved.parts)


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
    loaded: list[_Loaded],
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
        if _installed(entry):
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


# -- the files ----------------------------------------------------------------------------


def _command(target: str, datamodule: str | None) -> str:
    return f"lightning-bridge port {target}" + (f" --datamodule {datamodule}" if datamodule else "")


def _trial_name(module: _Loaded) -> str:
    return module.qualname.split(".")[-1] + "Trial"


def _model_def(module: _Loaded, data: _Loaded | None) -> str:
    imports: dict[str, set[str]] = {}
    for loaded in (module, data):
        if loaded is not None:
            imports.setdefault(loaded.module_name, set()).add(loaded.qualname.split(".")[0])
    import_lines = [
        f"from {name} import {', '.join(sorted(imports[name]))}" for name in sorted(imports)
    ]
    arguments = [f"    {module.qualname},"]
    if data is not None:
        arguments.append(f"    datamodule={data.qualname},")
    arguments.append("    base=PyTorchTrial,")
    trained_on = f" on {data.qualname.split('.')[-1]}" if data is not None else ""
    module_name = module.qualname.split(".")[-1]
    return "\n".join(
        [
            f'"""{module_name}{trained_on} as a Determined trial, written by `lightning-bridge '
            "port`.",
            "",
            "Regenerate this folder, from the folder the classes are imported from, with",
            "`lightning-bridge port TARGET"
            + (" --datamodule DATAMODULE" if data is not None else "")
            + " --out <this folder> --force`,",
            f"TARGET being {module.spec}"
            + (f",\nDATAMODULE being {data.spec}." if data is not None else "."),
            '"""',
            "",
            "from lightning_bridge import lightning_trial",
            "",
            "try:",
            "    # Determined's base class where Determined is installed (on a cluster, or when",
            "    # `lightning-bridge run` maps `determined` onto the bridge).",
            "    from determined.pytorch import PyTorchTrial",
            "except ImportError:",
            "    from lightning_bridge import PyTorchTrial",
            "",
            *import_lines,
            "",
            "_PortedTrial = lightning_trial(",
            *arguments,
            ")",
            "",
            "",
            f"class {_trial_name(module)}(_PortedTrial):",
            f'    """{module_name}{trained_on}, built from the hyperparameters in const.yaml."""',
            "",
        ]
    )


def _const_yaml(
    module: _Loaded,
    data: _Loaded | None,
    hparams: _Hyperparameters,
    metric: str,
    command: str,
) -> str:
    classes = module.qualname.split(".")[-1]
    if data is not None:
        classes += " and " + data.qualname.split(".")[-1]
    header = [
        f"# Written by `{command}`.",
        f"# hyperparameters: the constructor arguments of {classes} with their",
        "# default values; the trial passes each one to the argument of the same name, and",
        "# global_batch_size, split across processes, to `batch_size`.",
        "# searcher.metric: the first metric validation_step logs; check smaller_is_better and",
        "# max_length.",
    ]
    if hparams.skipped:
        header.append(
            "# Not written (not plain data; the constructor's default applies): "
            + ", ".join(hparams.skipped)
            + "."
        )
    config = {
        "name": module.qualname.split(".")[-1],
        "hyperparameters": {"global_batch_size": hparams.batch_size, **hparams.values},
        "searcher": {
            "name": "single",
            "metric": metric,
            "smaller_is_better": _smaller_is_better(metric),
            "max_length": {"epochs": DEFAULT_EPOCHS},
        },
        "min_validation_period": {"epochs": 1},
        "reproducibility": {"experiment_seed": EXPERIMENT_SEED},
        "resources": {"slots_per_trial": 1},
        "entrypoint": f"model_def:{_trial_name(module)}",
    }
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return "\n".join(header) + "\n" + body


def _startup_hook(requirements: list[str]) -> str:
    from . import __version__

    packages = " ".join([f'"lightning-bridge=={__version__}"', *requirements])
    return "\n".join(
        [
            "#!/bin/sh",
            "# Determined runs this in the task container before the entrypoint: it installs",
            "# the bridge, which trains the LightningModule as a trial, and the packages the",
            "# copied sources import.",
            "set -e",
            f"pip install {packages}",
            "",
        ]
    )
