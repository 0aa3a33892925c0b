"""Port: load the classes named on the command line and learn what the trial folder needs.

Everything `lightning-bridge port` finds out by importing the user's code: the classes (of
`lightning.pytorch` or `pytorch_lightning`; the checks the classes alone allow: a training
loader, a `training_step` a trial can call) and the hyperparameters their constructors default
to (arguments without a default are written for the user to fill). `_probe` runs the code.
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
from collections.abc import Iterator
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.adapter._lightning_packages import is_a, overrides
from lightning_bridge.adapter._refusals import signature_refusals
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


def _load(spec: str, kind: str, option: str) -> Loaded:
    """Import `module:QualName` and check that it is a Lightning `kind` subclass (of
    `lightning.pytorch` or `pytorch_lightning`)."""
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
                if inspect.isclass(value) and is_a(value, kind) and name != kind
            )
            hint = f" Its {kind} classes: {', '.join(found)}." if found else ""
            raise InvalidArgumentError(
                f"{option} {spec}: module {module_name!r} has no {qualname!r}.{hint}"
            )
        obj = getattr(obj, part)
    if not (inspect.isclass(obj) and is_a(obj, kind)):
        what = f"the class {obj.__name__}" if inspect.isclass(obj) else f"a {type(obj).__name__}"
        raise InvalidTrialError(
            f"{option} {spec} is {what}, not a {kind} subclass; name a class derived from "
            f"lightning.pytorch.{kind} (or pytorch_lightning.{kind})."
        )
    return Loaded(spec=spec, cls=obj, module=module)


def _check_hooks(module: Loaded, data: Loaded | None) -> None:
    """What the classes alone tell: a training loader, a `training_step` a trial can call."""
    dm_cls = data.cls if data is not None else None
    hook = "train_dataloader"
    if not (
        overrides(module.cls, hook, "LightningModule")
        or overrides(dm_cls, hook, "LightningDataModule")
    ):
        where = f"{data.spec} nor {module.spec} defines" if data else f"{module.spec} has no"
        fix = "" if data else " or pass --datamodule module:DataModuleClass"
        raise InvalidTrialError(
            f"{'Neither ' if data else ''}{where} {hook}(); the trial needs a training "
            f"loader. Define {hook}(){fix}."
        )
    problems = signature_refusals(module.cls)
    if problems:
        raise InvalidTrialError(f"{module.spec}: {problems[0]}")


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
    """Constructor arguments and their defaults; arguments without one are left to fill."""
    result = Hyperparameters()
    module_batch: int | None = None
    for cls in (module_cls, dm_cls):
        if cls is None:
            continue
        params = _constructor_parameters(cls)
        for p in params:
            if p.default is inspect.Parameter.empty:
                if p.name == "batch_size":
                    continue  # the trial gives each process its share of global_batch_size
                if p.name not in result.values:
                    result.values[p.name] = None
                    result.to_fill.append(f"{cls.__name__}.{p.name}")
                continue
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
