"""Port: load the classes named on the command line and learn what the trial folder needs.

Everything `lightning-bridge port` finds out by importing and running the user's code: the
classes (and the checks that they can be a trial: subclasses, loaders, `validation_step`), the
hyperparameters their constructors default to, and the first metric one validation batch logs.
Kept apart from writing the folder so that each failure here is one message about the user's
classes, before anything is written.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import math
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.port._folder import CONST_YAML, Hyperparameters, Loaded

logger = logging.getLogger("lightning_bridge")

_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


# -- loading and checks ---------------------------------------------------------------------


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


def _load(spec: str, base: type, option: str, kind: str) -> Loaded:
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
    return Loaded(spec=spec, cls=obj, module=module)


def _overrides(cls: type | None, hook: str, base: type) -> bool:
    return cls is not None and getattr(cls, hook, None) is not getattr(base, hook, None)


def _check_hooks(module: Loaded, data: Loaded | None) -> None:
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


def _hyperparameters(module_cls: type, dm_cls: type | None) -> Hyperparameters:
    """Constructor arguments and their defaults; arguments without one are refused."""
    result = Hyperparameters()
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


def _probe_validation(module: Loaded, data: Loaded | None) -> tuple[list[str], int | None]:
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
