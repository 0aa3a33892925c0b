"""Lightning callbacks of a ported module: which run, which map onto the config, which are refused.

A project gives `lightning.Trainer(callbacks=[...])` and `configure_callbacks()` callbacks. As a
trial (`lightning_trial(callbacks=...)` for the Trainer's):

- run at Lightning's moments, with the stand-in trainer: `EarlyStopping` (its stop request is
  the trial's `set_stop_requested`), `LearningRateMonitor` (the learning rates are reported
  with the training metrics), `StochasticWeightAveraging` (modules without BatchNorm),
  `GradientAccumulationScheduler`, `LambdaCallback` and the user's own `Callback` subclasses;
- not run, mapped onto the experiment config: `ModelCheckpoint`, whose `monitor` / `mode` are
  the searcher metric and `smaller_is_better` that choose the checkpoints a trial keeps;
- not run, display only: progress bars and model summaries (the trainer has its own);
- refused by name: every other Lightning callback (finetuning, pruning, tuners, timers, ...).

The model's callbacks replace the Trainer's of the same type, as in Lightning. `Hooks` runs a
hook as `lightning.Trainer` does: the running callbacks' first, then the module's, each under
the hook's name (what `self.log` checks).
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_bridge.adapter._lightning_packages import is_a, overrides, package_of
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.translation._lightning_private import current_hook, set_current_hook

logger = logging.getLogger("lightning_bridge")

_RUN = (
    "EarlyStopping",
    "LearningRateMonitor",
    "StochasticWeightAveraging",
    "GradientAccumulationScheduler",
    "LambdaCallback",
)
_DISPLAY = ("ProgressBar", "ModelSummary")
_WHY = {
    "BaseFinetuning": "it adds parameter groups to the optimizer while training, which the "
    "trial's wrapped optimizer and checkpoints do not follow; unfreeze in the module's "
    "on_train_epoch_start instead",
    "BatchSizeFinder": "it runs trial fits to tune the batch size; set global_batch_size in "
    "the hyperparameters (or search over it)",
    "LearningRateFinder": "it runs trial fits to tune the learning rate; search over the "
    "learning rate with the experiment's searcher",
    "Timer": "the trial's length is searcher.max_length",
    "ModelPruning": "it changes the module's parameters into masked ones during fit, which the "
    "trial's wrapped model does not follow",
}


def _lightning_class(cb: Any) -> str | None:
    """The first class of `cb` that Lightning itself defines (other than `Callback`)."""
    for klass in type(cb).__mro__:
        module = klass.__module__
        if module.startswith(("lightning.pytorch.callbacks", "pytorch_lightning.callbacks")):
            return None if klass.__name__ == "Callback" else klass.__name__
    return None


def _is(cb: Any, name: str) -> bool:
    return any(k.__name__ == name for k in type(cb).__mro__) and _lightning_class(cb) is not None


def is_monitoring(cb: Any) -> bool:
    """EarlyStopping and checkpoint callbacks run after the module's `on_train_epoch_end`."""
    return _is(cb, "EarlyStopping") or _is(cb, "Checkpoint")


def merge(trainer_callbacks: list[Any], model_callbacks: list[Any]) -> list[Any]:
    """Lightning's merge: the model's callbacks replace the Trainer's of the same type."""
    overridden = {
        type(t)
        for t in trainer_callbacks
        for m in model_callbacks
        if isinstance(m, type(t)) or issubclass(type(m), type(t))
    }
    merged = [c for c in trainer_callbacks if type(c) not in overridden] + list(model_callbacks)
    return [c for c in merged if not _is(c, "Checkpoint")] + [
        c for c in merged if _is(c, "Checkpoint")
    ]


def callback_problems(
    callbacks: list[Any], module: Any, config: ConfigValues, aggregation: bool
) -> list[str]:
    """Messages for the callbacks a trial cannot run (empty when all can)."""
    out: list[str] = []
    for cb in callbacks:
        if not is_a(cb, "Callback"):
            out.append(
                f"{type(cb).__name__} is not a Lightning Callback; give lightning.pytorch (or "
                "pytorch_lightning) Callback instances."
            )
            continue
        name = _lightning_class(cb)
        if name is None or any(_is(cb, ok) for ok in _RUN + _DISPLAY):
            out.extend(_run_problems(cb, module, aggregation))
            continue
        if _is(cb, "ModelCheckpoint"):
            out.extend(_checkpoint_problems(cb, config))
            continue
        why = next((text for base, text in _WHY.items() if _is(cb, base)), None)
        out.append(
            f"{type(cb).__name__} is not supported by LightningAdapter"
            + (f": {why}." if why else ": a trial has no lightning.Trainer to run it.")
        )
    return out


def _run_problems(cb: Any, module: Any, aggregation: bool) -> list[str]:
    name = type(cb).__name__
    if _is(cb, "StochasticWeightAveraging"):
        import torch

        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            return [
                f"{name} on a module with BatchNorm layers is not supported by "
                "LightningAdapter: Lightning adds an extra epoch to recompute the BatchNorm "
                "statistics of the averaged weights, and a trial trains exactly its length. "
                "Use it on modules without BatchNorm, or recompute the statistics after "
                "training (torch.optim.swa_utils.update_bn)."
            ]
    if _is(cb, "GradientAccumulationScheduler") and aggregation:
        return [
            f"{name} changes accumulate_grad_batches from epoch to epoch, but "
            "optimizations.aggregation_frequency fixes the trial's gradient aggregation; "
            "remove aggregation_frequency from the experiment config (the adapter then "
            "accumulates as the scheduler says)."
        ]
    return []


def _checkpoint_problems(cb: Any, config: ConfigValues) -> list[str]:
    monitor = getattr(cb, "monitor", None)
    metric = config.searcher_metric
    if monitor is None or metric is None:
        return []
    smaller = config.smaller_is_better
    if monitor != metric or (cb.mode == "min") != smaller:
        return [
            f"ModelCheckpoint(monitor={monitor!r}, mode={cb.mode!r}) chooses checkpoints by a "
            f"metric, and a trial keeps checkpoints by its searcher metric, which is {metric!r} "
            f"(smaller_is_better: {str(smaller).lower()}): set searcher.metric: {monitor} and "
            f"smaller_is_better: {str(cb.mode == 'min').lower()} in the experiment config, or "
            "drop the callback."
        ]
    return []


class _ReportingLogger:
    """`trainer.loggers[0]` for callbacks that log (LearningRateMonitor): values go into the
    trial's training metrics."""

    name = "lightning_bridge"
    version = 0
    save_dir = None

    def __init__(self, add: Any) -> None:
        self._add = add

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._add(metrics)

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters are the trial's; nothing to record."""

    def save(self) -> None:
        """Reported with the trial's metrics; nothing to flush."""

    def finalize(self, status: str) -> None:
        """Nothing to close."""


class TrainerCallbacks:
    """The callbacks that run, called at Lightning's moments with the stand-in trainer."""

    def __init__(self, callbacks: list[Any], module: Any, trainer: Any, report: Any) -> None:
        self.all = callbacks
        self.running = [
            c
            for c in callbacks
            if not (_is(c, "ModelCheckpoint") or any(_is(c, d) for d in _DISPLAY))
        ]
        self._module = module
        self._trainer = trainer
        for cb in callbacks:
            if any(_is(cb, d) for d in _DISPLAY):
                logger.info(
                    "%s is display only and not run: the trainer shows its own progress.",
                    type(cb).__name__,
                )
        trainer.callbacks = list(callbacks)
        checkpoints = [c for c in callbacks if _is(c, "ModelCheckpoint")]
        stoppers = [c for c in callbacks if _is(c, "EarlyStopping")]
        trainer.checkpoint_callbacks = checkpoints
        trainer.checkpoint_callback = checkpoints[0] if checkpoints else None
        trainer.early_stopping_callbacks = stoppers
        trainer.early_stopping_callback = stoppers[0] if stoppers else None
        if any(_is(c, "LearningRateMonitor") for c in self.running):
            trainer.loggers = [_ReportingLogger(report)]
            trainer.logger = trainer.loggers[0]

    def call(self, hook: str, *args: Any, monitoring: bool | None = None) -> None:
        """`hook(trainer, module, *args)` of each running callback, in order."""
        module = self._module
        for cb in self.running:
            if monitoring is not None and is_monitoring(cb) != monitoring:
                continue
            previous = current_hook(module)
            set_current_hook(module, hook)
            try:
                getattr(cb, hook)(self._trainer, module, *args)
            finally:
                set_current_hook(module, previous)

    def state_dict(self) -> dict[str, Any]:
        return {str(cb.state_key): cb.state_dict() for cb in self.running}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for cb in self.running:
            state = states.get(str(cb.state_key))
            if state:
                cb.load_state_dict(state)


def call_hook(module: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
    """Run the module's `hook` under its name (what `self.log` checks), as Lightning does."""
    previous = current_hook(module)
    set_current_hook(module, hook)
    try:
        return getattr(module, hook)(*args, **kwargs)
    finally:
        set_current_hook(module, previous)


class Hooks:
    """A module's hooks and its running callbacks', called in Lightning's order."""

    def __init__(self, module: Any, callbacks: TrainerCallbacks) -> None:
        self.module = module
        self.callbacks = callbacks

    def call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        """The module's `hook` alone."""
        return call_hook(self.module, hook, *args, **kwargs)

    def run(self, hook: str, *args: Any) -> Any:
        """The callbacks' `hook`, then the module's (Lightning's order)."""
        self.callbacks.call(hook, *args)
        return call_hook(self.module, hook, *args)

    def overrides(self, hook: str) -> bool:
        """Whether the module overrides LightningModule's `hook`."""
        return overrides(self.module, hook, "LightningModule")


def model_callbacks(module: Any) -> list[Any]:
    """`configure_callbacks()` as a list (Lightning accepts one callback or a sequence)."""
    package = package_of(module)
    returned = call_hook(module, "configure_callbacks")
    if returned is None:
        return []
    if isinstance(returned, package.Callback) or is_a(returned, "Callback"):
        return [returned]
    return list(returned)


def checkpoint_monitor(callbacks: list[Any]) -> tuple[str, str] | None:
    """(monitor, mode) of the first ModelCheckpoint that monitors a metric, if any."""
    for cb in callbacks:
        if _is(cb, "ModelCheckpoint") and getattr(cb, "monitor", None):
            return str(cb.monitor), str(cb.mode)
    return None
