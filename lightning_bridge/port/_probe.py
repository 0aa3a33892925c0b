"""Port: run the user's classes to check them and to find the searcher metric.

Both classes are built with their defaults and checked by the adapter's own checks (the same
`lightning_trial` runs when the trial is built: callbacks, Trainer settings, ...). The metric:
`ModelCheckpoint(monitor=...)` from `configure_callbacks()` when there is one (with its
`mode`, and `checkpoint_policy: best`); else Lightning validates one batch on the CPU and the
first value `validation_step` logged is the metric; a module without validation trains one
batch instead and the first value logged in training is the metric (the trial reports training
values as its validation metrics). When a constructor argument has no default, nothing can be
built: the metric is read from the source (`self.log("name", ...)`), to be checked.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
import tempfile
import textwrap
import warnings
from typing import Any

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_callbacks import checkpoint_monitor, merge, model_callbacks
from lightning_bridge.adapter._lightning_packages import package_of
from lightning_bridge.adapter._refusals import has_validation, refusals
from lightning_bridge.adapter._trainer_arguments import TrainerSettings
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.port._folder import Loaded, Searcher

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
_QUIET = ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning")


def smaller_is_better(metric: str) -> bool:
    words = {w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w}
    return not (words & _LARGER_IS_BETTER)


def probe(module: Loaded, data: Loaded | None, buildable: bool) -> tuple[Searcher, int | None]:
    """The searcher settings and the batch size of the loader that ran (None if none ran)."""
    if not buildable:
        metric = _metric_in_source(module.cls)
        return Searcher(metric, smaller_is_better(metric), "source"), None
    model, datamodule = _build(module), (_build(data) if data is not None else None)
    callbacks = merge([], model_callbacks(model))
    problems = refusals(model, datamodule, callbacks, TrainerSettings(), ConfigValues())
    if problems:
        raise InvalidTrialError(f"{module.spec}: {problems[0]}")
    validates = has_validation(model, datamodule)
    names, batch_size = _run_once(module, model, datamodule, validate=validates)
    monitored = checkpoint_monitor(callbacks)
    if monitored is not None:
        metric, mode = monitored
        return Searcher(metric, mode == "min", "checkpoint", "best"), batch_size
    source = "validation" if validates else "training"
    if not names and validates:
        # Validation logs nothing the trial would report: the trial then reports the training
        # values as its validation metrics (as for a module without validation).
        names, _ = _run_once(module, model, datamodule, validate=False)
        source = "training"
    if not names:
        if not model.automatic_optimization:
            raise InvalidTrialError(
                f"{module.spec} logs no metric in validation and none in training. The "
                "searcher needs a metric: log one with self.log('train_loss', loss) in "
                "training_step (or 'val_loss' in validation_step)."
            )
        names = ["loss"]  # the training step's loss, which the trial reports
    metric = names[0]
    return Searcher(metric, smaller_is_better(metric), source), batch_size


def _build(loaded: Loaded) -> Any:
    try:
        return loaded.cls()
    except Exception as exc:  # noqa: BLE001 - user code
        raise InvalidTrialError(
            f"{loaded.spec}: building {loaded.cls.__name__}() with its default arguments "
            f"failed: {type(exc).__name__}: {exc}. Port builds it to check it and to find the "
            "metric to search on; make the defaults work."
        ) from None


def _run_once(
    loaded: Loaded, model: Any, datamodule: Any, *, validate: bool
) -> tuple[list[str], int | None]:
    """Validate one batch (or, without validation, train one) with the module's Lightning."""
    pl = package_of(model)
    levels = {name: logging.getLogger(name).level for name in _QUIET}
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                max_steps=1,
                limit_train_batches=1,
                limit_val_batches=1 if validate else 0,
                num_sanity_val_steps=0,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=root,
            )
            if validate:
                results = trainer.validate(model, datamodule=datamodule, verbose=False)
                names = [str(name) for name in (results[0] if results else {})]
                loader = trainer.val_dataloaders
            else:
                trainer.fit(model, datamodule=datamodule)
                names = _logged_names(trainer.callback_metrics)
                loader = trainer.train_dataloader
        except Exception as exc:  # noqa: BLE001 - user code
            what = "validating" if validate else "training"
            raise InvalidTrialError(
                f"{loaded.spec}: {what} one batch with Lightning failed: "
                f"{type(exc).__name__}: {exc}. Port runs it once to find the metric to search "
                "on; fix the error (try lightning.Trainer(fast_dev_run=True))."
            ) from None
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
    if isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    batch_size = getattr(loader, "batch_size", None)
    return names, batch_size if isinstance(batch_size, int) else None


def _logged_names(callback_metrics: dict[str, Any]) -> list[str]:
    """The names a trial reports from training, in the order they were logged."""
    names: list[str] = []
    for name in callback_metrics:
        base = re.sub(r"_(step|epoch)$", "", name)
        plain = base if base in callback_metrics else name
        if plain not in names:
            names.append(plain)
    return names


def _metric_in_source(cls: type) -> str:
    """The first name `validation_step` (else `training_step`) passes to `self.log`."""
    for hook in ("validation_step", "training_step"):
        for klass in cls.__mro__:
            if hook not in vars(klass) or klass.__module__.startswith(
                ("lightning.", "pytorch_lightning.")
            ):
                continue
            try:
                source = textwrap.dedent(inspect.getsource(vars(klass)[hook]))
            except (OSError, TypeError):
                continue
            for node in ast.walk(ast.parse(source)):
                name = _logged_name(node)
                if name is not None:
                    return name
    return "val_loss"


def _logged_name(node: ast.AST) -> str | None:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr == "log" and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    if node.func.attr == "log_dict" and node.args and isinstance(node.args[0], ast.Dict):
        keys = [k for k in node.args[0].keys if isinstance(k, ast.Constant)]
        return str(keys[0].value) if keys else None
    return None
