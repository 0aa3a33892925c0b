"""The `lightning.Trainer` arguments of a ported project, read from the trial's hparams and config.

A project trained by `lightning.Trainer(...)` passes arguments the module depends on. As a
trial each has one place:

- hparams: `gradient_clip_val`, `gradient_clip_algorithm`, `accumulate_grad_batches`,
  `precision`, `limit_train_batches`, `limit_val_batches`, `log_every_n_steps` (the adapter
  applies them itself, the same way on either trainer), `num_sanity_val_steps` (0: a trial
  runs no sanity check);
- the experiment config: `searcher.max_length` (`max_epochs` / `max_steps`, which the module
  reads from `self.trainer`), `min_validation_period` (`check_val_every_n_epoch` /
  `val_check_interval`, also accepted as hparams when the config's period is what they mean),
  `optimizations.aggregation_frequency` (the trial's gradient aggregation, the same as
  `accumulate_grad_batches`);
- `lightning_trial(callbacks=...)`: the Trainer's callbacks.

Any other Trainer argument found among the hparams (and taken by neither constructor) is
refused with the place it belongs, so that nothing a project relies on is dropped unseen.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
from typing import Any

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._context import (
    PyTorchTrialContext,
    config_values,
    context_setup,
)
from lightning_bridge.translation._engine_settings import EngineSettings

HPARAM_SETTINGS = (
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "accumulate_grad_batches",
    "limit_train_batches",
    "limit_val_batches",
    "log_every_n_steps",
    "num_sanity_val_steps",
    "val_check_interval",
    "check_val_every_n_epoch",
)
# The precisions the adapter applies (Fabric's names; EngineSettings reads the aliases).
_PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
_PLACES = {
    **dict.fromkeys(
        ("max_epochs", "max_steps", "min_epochs", "min_steps", "max_time"),
        "the trial's length is searcher.max_length in the experiment config (and "
        "fit(max_length=...)); the module reads it as self.trainer.max_epochs / max_steps",
    ),
    "callbacks": "pass Trainer callbacks as lightning_trial(..., callbacks=[...])",
    **dict.fromkeys(
        ("accelerator", "strategy", "devices", "num_nodes"),
        "the trainer places the trial: resources.slots_per_trial in the experiment config",
    ),
    "enable_checkpointing": "checkpoints are the trial's: checkpoint_policy and checkpoint_period",
}


@dataclasses.dataclass
class Length:
    """The trial's length from the config: `unit` is "epochs" or "batches"."""

    unit: str
    value: int


@dataclasses.dataclass
class TrainerSettings:
    """What `lightning.Trainer(...)` would have been given, as the trial knows it."""

    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None
    accumulate_grad_batches: int = 1
    # The trial's own gradient aggregation (optimizations.aggregation_frequency) does it.
    aggregation: bool = False
    precision: str = "32-true"
    length: Length | None = None
    val_check_interval: int | float = 1.0
    check_val_every_n_epoch: int | None = 1
    # The validation period the config gives, and the one the hparams ask for (None: none).
    period: Length | None = None
    validation_hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    limit_train_batches: int | float = 1.0
    limit_val_batches: int | float = 1.0
    # Lightning's default; given as an hparam, `should_update_logs` follows it (without it,
    # every step's values go into the trial's reporting window, which averages them).
    log_every_n_steps: int = 50
    log_every_n_steps_given: bool = False

    def train_batches(self, length: int) -> int:
        """Batches of an epoch of `length` batches that the trial trains (limit_train_batches)."""
        return _num_batches(length, self.limit_train_batches, "train")

    def val_batches(self, length: int) -> int:
        """Batches of a validation loader of `length` batches that run (limit_val_batches)."""
        return _num_batches(length, self.limit_val_batches, "val")

    def check_validation_period(self, epoch_len: int | None) -> None:
        """`val_check_interval` / `check_val_every_n_epoch` given as hparams must be what the
        config's `min_validation_period` says (a trial validates on its trainer's schedule)."""
        if not self.validation_hparams:
            return
        given = ", ".join(f"{k}={v!r}" for k, v in sorted(self.validation_hparams.items()))
        wanted = _lightning_period(self.val_check_interval, self.check_val_every_n_epoch, epoch_len)
        if wanted is None:
            raise InvalidTrialError(
                f"hparams {given}: lightning.Trainer validates every "
                f"{_describe(self.val_check_interval, self.check_val_every_n_epoch, epoch_len)}, "
                "restarting the count each epoch, which a trial's validation period (counted "
                "across epochs) cannot express. Use a val_check_interval that divides the "
                f"epoch's {epoch_len} batches, or check_val_every_n_epoch=None (counted across "
                "epochs), and set min_validation_period to match."
            )
        if self.period != wanted:
            write = f"{{{wanted.unit}: {wanted.value}}}"
            raise InvalidTrialError(
                f"hparams {given} mean validating every {wanted.value} {wanted.unit}, but the "
                "trial validates on its trainer's schedule, min_validation_period in the "
                f"experiment config, which is {_period_text(self.period)}: set "
                f"min_validation_period: {write} (and fit(validation_period=...) to the same), "
                "or remove the hparams."
            )

    def max_epochs(self, epoch_len: int | None, what: str = "max_epochs") -> int:
        """`Trainer.max_epochs` for the trial's length (the epochs it starts)."""
        length = self._length(what)
        if length.unit == "epochs":
            return length.value
        if not epoch_len:
            return -1
        return math.ceil(length.value / epoch_len)

    def max_steps(self, epoch_len: int | None, accumulate: int, what: str = "max_steps") -> int:
        """`Trainer.max_steps`: -1 for a length in epochs, else the optimizer steps it makes."""
        length = self._length(what)
        if length.unit == "epochs":
            return -1
        if not epoch_len or accumulate == 1:
            return length.value // accumulate
        whole, rest = divmod(length.value, epoch_len)
        return whole * math.ceil(epoch_len / accumulate) + rest // accumulate

    def estimated_stepping_batches(self, epoch_len: int | None, accumulate: int) -> int | float:
        """Lightning's estimate of the optimizer steps of the whole fit."""
        epochs = self.max_epochs(epoch_len, "estimated_stepping_batches")
        steps = self.max_steps(epoch_len, accumulate, "estimated_stepping_batches")
        if epochs == -1:
            return float("inf") if steps == -1 else steps
        assert epoch_len is not None
        estimate = math.ceil(epoch_len / accumulate) * max(epochs, 1)
        return min(estimate, steps) if steps != -1 else estimate

    def _length(self, attribute: str) -> Length:
        if self.length is None:
            raise InvalidTrialError(
                f"The LightningModule read `self.trainer.{attribute}`, but the trial's length is "
                "not known when the trial is built: set searcher.max_length in the experiment "
                "config ({epochs: N} or {batches: N}; with lightning_bridge.init or "
                "determined.pytorch.init, pass exp_conf=...), the same length fit() trains."
            )
        return self.length


def _num_batches(length: int, limit: int | float, stage: str) -> int:
    """Lightning's count of the batches a loader of `length` runs under `limit_{stage}_batches`."""
    count = min(length, limit) if isinstance(limit, int) else int(length * limit)
    if count == 0 and isinstance(limit, float) and limit > 0:
        raise InvalidTrialError(
            f"hparams['limit_{stage}_batches'] is {limit}, but {limit} * {length} batches < 1: "
            f"increase it (at least {1.0 / length}), as lightning.Trainer asks."
        )
    return int(count)


def _lightning_period(
    interval: int | float, every_n_epochs: int | None, epoch_len: int | None
) -> Length | None:
    """The trial's validation period for Lightning's `val_check_interval` and
    `check_val_every_n_epoch` (None when a period counted across epochs cannot say it)."""
    if isinstance(interval, float) and interval == 1.0:
        return Length("epochs", every_n_epochs or 1)
    batches = interval if isinstance(interval, int) else max(1, int((epoch_len or 0) * interval))
    if every_n_epochs is None:
        return Length("batches", batches)
    if every_n_epochs == 1 and epoch_len and epoch_len % batches == 0:
        return Length("batches", batches)
    return None


def _describe(interval: int | float, every_n_epochs: int | None, epoch_len: int | None) -> str:
    batches = interval if isinstance(interval, int) else max(1, int((epoch_len or 0) * interval))
    return f"{batches} batches counted within the epoch (check_val_every_n_epoch={every_n_epochs})"


def _period_text(period: Length | None) -> str:
    return "not set" if period is None else f"{{{period.unit}: {period.value}}}"


def _limit(hparams: dict[str, Any], name: str) -> int | float:
    """`limit_*_batches` as lightning.Trainer reads it: a fraction in [0.0, 1.0] or a count."""
    value = hparams.get(name)
    if value is None:
        return 1.0
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        if isinstance(value, float) and 0 <= value <= 1:
            return value
        if value >= 0 and float(value).is_integer():
            return int(value)
    raise InvalidTrialError(
        f"hparams[{name!r}] is {value!r}; give a fraction of the epoch in [0.0, 1.0] or a "
        "number of batches (an int), as lightning.Trainer takes it."
    )


def _validation_hparams(hparams: dict[str, Any], settings: TrainerSettings) -> None:
    """`val_check_interval` / `check_val_every_n_epoch` from the hparams (checked later
    against the config's period, once the epoch's length is known)."""
    names = ("val_check_interval", "check_val_every_n_epoch")
    given: dict[str, Any] = {k: hparams[k] for k in names if k in hparams}
    if not given:
        return
    interval = given.get("val_check_interval", 1.0)
    if interval is None:
        interval = 1.0
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise InvalidTrialError(
            f"hparams['val_check_interval'] is {interval!r}; give a fraction of the epoch "
            "(a float in (0.0, 1.0]) or a number of batches (an int), as lightning.Trainer "
            "takes it."
        )
    if isinstance(interval, float) and interval > 1:
        raise InvalidTrialError(
            f"hparams['val_check_interval'] is {interval}; a float is a fraction of the epoch "
            "in (0.0, 1.0], an int a number of batches."
        )
    every = given.get("check_val_every_n_epoch", 1)
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise InvalidTrialError(
            f"hparams['check_val_every_n_epoch'] is {every!r}; give an int >= 1, or null to "
            "count val_check_interval across epochs."
        )
    settings.validation_hparams = given
    settings.val_check_interval = interval
    settings.check_val_every_n_epoch = every


def _log_and_sanity(hparams: dict[str, Any], settings: TrainerSettings) -> None:
    every = hparams.get("log_every_n_steps")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidTrialError(
                f"hparams['log_every_n_steps'] must be an int >= 1; got {every!r}."
            )
        settings.log_every_n_steps, settings.log_every_n_steps_given = every, True
    sanity = hparams.get("num_sanity_val_steps")
    if sanity not in (None, 0):
        raise InvalidTrialError(
            f"hparams['num_sanity_val_steps'] is {sanity!r}: a trial runs no sanity check "
            "before training (its validation runs on the trial's schedule, and checkpoints "
            "keep a run from failing late). Set it to 0 or remove it."
        )


def config_of(context: Any) -> ConfigValues:
    """What the adapter reads of the trial's experiment config: the values the bridge's
    context read when it was built, or (Determined's own context) read from its config now
    (the defaults without one)."""
    if isinstance(context, PyTorchTrialContext):
        return config_values(context)
    try:
        config = context.get_experiment_config()
    except Exception:  # noqa: BLE001 - a context built without an experiment config
        config = None
    return ConfigValues.of(config if isinstance(config, dict) else None)


def _unit(value: Any, where: str, global_batch_size: Any) -> Length | None:
    if value is None:
        return None
    if isinstance(value, dict) and len(value) == 1:
        ((unit, count),) = value.items()
        if unit == "records" and isinstance(count, int) and isinstance(global_batch_size, int):
            return Length("batches", max(count // global_batch_size, 1))
        if unit in ("epochs", "batches") and isinstance(count, int) and count >= 1:
            return Length(unit, count)
    raise InvalidTrialError(
        f"{where} in the experiment config is {value!r}; write {{epochs: N}} or {{batches: N}}."
    )


def precision_of(value: Any, device: Any) -> str:
    """Lightning's precision name for `hparams["precision"]` on `device` (the one place the
    adapter maps precision values; EngineSettings reads the aliases)."""
    unified = EngineSettings(precision=value).precision_name()
    if unified not in _PRECISIONS:
        raise InvalidTrialError(
            f"hparams['precision'] is {value!r}; LightningAdapter applies "
            f"{', '.join(sorted(_PRECISIONS))} (as lightning.Trainer(precision=))."
        )
    if unified == "16-mixed":
        if str(device).startswith("cuda"):
            raise InvalidTrialError(
                "hparams['precision'] is '16-mixed': float16 mixed precision needs a gradient "
                "scaler, which LightningAdapter does not run. Use 'bf16-mixed' (autocast to "
                "bfloat16, no scaler), or write a PyTorchTrial with context.wrap_scaler()."
            )
        # As lightning.Trainer on the CPU: float16 autocast is not available, bfloat16 is used.
        unified = "bf16-mixed"
    return unified


def precision_plugin(package: Any, precision: str, device_type: str) -> Any:
    """Lightning's precision plugin for `precision`, from the module's own package."""
    plugins = importlib.import_module(f"{package.__name__}.plugins.precision")
    if precision == "64-true":
        return plugins.DoublePrecision()
    if precision == "bf16-mixed":
        return plugins.MixedPrecision("bf16-mixed", device_type)
    if precision in ("bf16-true", "16-true"):
        return plugins.HalfPrecision(precision)
    return plugins.Precision()


def read_settings(
    context: Any, hparams: dict[str, Any], constructor_args: set[str] | None
) -> TrainerSettings:
    """The settings from `hparams` and the experiment config; `constructor_args` (the names
    the module and data module take, for `lightning_trial`) enables the check that no other
    Trainer argument hides among the hparams."""
    if constructor_args is not None:
        _refuse_trainer_arguments(hparams, constructor_args)
    config = config_of(context)
    settings = TrainerSettings()
    clip = hparams.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))):
        raise InvalidTrialError(f"hparams['gradient_clip_val'] must be a number; got {clip!r}.")
    settings.gradient_clip_val = None if clip is None else float(clip)
    algorithm = hparams.get("gradient_clip_algorithm")
    if algorithm is not None and str(algorithm).lower() not in ("norm", "value"):
        raise InvalidTrialError(
            f"hparams['gradient_clip_algorithm'] is {algorithm!r}; use 'norm' or 'value'."
        )
    settings.gradient_clip_algorithm = None if algorithm is None else str(algorithm).lower()
    settings.accumulate_grad_batches = _accumulation(context, config, hparams, settings)
    if "precision" in hparams and "precision" not in (constructor_args or set()):
        settings.precision = precision_of(hparams["precision"], getattr(context, "device", "cpu"))
    gbs = config.global_batch_size
    if gbs is None:
        gbs = hparams.get("global_batch_size")
    settings.length = _unit(config.max_length, "searcher.max_length", gbs)
    period = _unit(config.min_validation_period, "min_validation_period", gbs)
    settings.period = period
    if period is not None and period.unit == "epochs":
        settings.check_val_every_n_epoch = period.value
    elif period is not None:
        settings.val_check_interval = period.value
        settings.check_val_every_n_epoch = None
    # An hparam a constructor takes is the module's, not a Trainer argument.
    hparams = {k: v for k, v in hparams.items() if k not in (constructor_args or set())}
    settings.limit_train_batches = _limit(hparams, "limit_train_batches")
    if settings.limit_train_batches == 0:
        raise InvalidTrialError(
            "hparams['limit_train_batches'] is 0, which makes lightning.Trainer skip training; "
            "a trial trains for searcher.max_length. Remove it or give a positive value."
        )
    settings.limit_val_batches = _limit(hparams, "limit_val_batches")
    _validation_hparams(hparams, settings)
    _log_and_sanity(hparams, settings)
    return settings


def _aggregation_frequency(context: Any, config: ConfigValues) -> Any:
    """The trial's aggregation frequency: the bridge context's (given to `init()` or by the
    config), Determined's context's own (it has no public accessor), else the config's."""
    if isinstance(context, PyTorchTrialContext):
        return context_setup(context).aggregation_frequency
    aggregation = getattr(context, "_aggregation_frequency", None)
    return aggregation if isinstance(aggregation, int) else config.aggregation_frequency


def _accumulation(
    context: Any, config: ConfigValues, hparams: dict[str, Any], settings: TrainerSettings
) -> int:
    """`accumulate_grad_batches` from the hparams or the trial's aggregation_frequency."""
    aggregation = _aggregation_frequency(context, config)
    wanted = hparams.get("accumulate_grad_batches")
    if wanted is not None and (
        isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1
    ):
        raise InvalidTrialError(
            f"hparams['accumulate_grad_batches'] must be an int >= 1; got {wanted!r}."
        )
    if aggregation > 1:
        if wanted is not None and wanted != aggregation:
            raise InvalidTrialError(
                f"hparams['accumulate_grad_batches'] is {wanted} but "
                f"optimizations.aggregation_frequency is {aggregation}; they are the same "
                "setting. Give one of them."
            )
        settings.aggregation = True
        return int(aggregation)
    return 1 if wanted is None else int(wanted)


def _refuse_trainer_arguments(hparams: dict[str, Any], constructor_args: set[str]) -> None:
    import lightning.pytorch as pl

    trainer_args = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    handled = set(HPARAM_SETTINGS) | {"precision"}
    for name in sorted(set(hparams) & trainer_args - handled - constructor_args):
        place = _PLACES.get(name, "LightningAdapter does not take this lightning.Trainer argument")
        raise InvalidTrialError(
            f"hparams[{name!r}] is a lightning.Trainer argument that no constructor of the "
            f"module or data module takes, and a trial has no lightning.Trainer: {place}. "
            "Remove it from the hyperparameters."
        )
