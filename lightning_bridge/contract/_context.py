"""`PyTorchTrialContext`: what a trial uses to wrap its objects and talk to the training loop.

The context records the models, optimizers, schedulers and reducers a trial wraps. During a fit
it reads the fit's progress through one read-only view (`FitView`, the fit's `TrialCore`,
attached with `attach_fit`) and forwards `backward` and `step_optimizer` to the view's
`StepDriver`, so the backward pass and optimizer steps go through Lightning's strategy and
precision plugin.

The experiment config reaches the context as the dict Determined's API hands the trial
(`get_experiment_config()`). The few values the fit reads of it (the searcher metric and its
direction, the `checkpoint_storage` section, the experiment seed) are read once, when the
context is built, into a frozen `ConfigValues` (`config_values`), so the fit's modules read
named, typed fields instead of the dict's keys.

The rest of the context's own state the fit reads (its folders, processes and aggregation:
`context_setup`; the trial's gradient scaler, profiler options and what a checkpoint records
of its config) is read through this module's functions, never its private attributes.

Trials read some of Determined's private context attributes (its AMP test fixture reads
`context._aggregation_frequency`, examples and model_hub read `context._epoch_len` and
`context._current_batch_idx`): `DETERMINED_PRIVATE_NAMES` lists those the bridge keeps, each
with Determined's value; the others Determined has fail with a message naming what to use.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract._amp import autocast_forward, check_scaler, warn_once
from lightning_bridge.contract._data import to_device
from lightning_bridge.contract._determined_compat import as_bridge_enum
from lightning_bridge.contract._distributed import DistributedContext, split_batch_size
from lightning_bridge.contract._experimental import PyTorchExperimentalContext
from lightning_bridge.contract._lr_scheduler import LRScheduler, step_count
from lightning_bridge.contract._reducer import MetricReducer, ReducerRegistry
from lightning_bridge.contract._step import prepare_step

if TYPE_CHECKING:
    from lightning_bridge.contract._step import StepDriver

logger = logging.getLogger("lightning_bridge")


@dataclasses.dataclass(frozen=True)
class ConfigValues:
    """What a fit reads of its experiment config, read once (the defaults: no config given).

    `checkpoint_storage` is the config's section as given (None when absent): the checkpoint
    storage and the retention policy are built from it where they are made. `max_length`
    (the searcher's), `min_validation_period` and `global_batch_size` (the hyperparameters')
    are as given too: the fit reading them parses them into its own units.
    """

    searcher_metric: str | None = None
    smaller_is_better: bool = True
    checkpoint_storage: Mapping[str, Any] | None = None
    experiment_seed: Any = None
    aggregation_frequency: Any = 1
    max_length: Any = None
    min_validation_period: Any = None
    global_batch_size: Any = None

    @classmethod
    def of(cls, exp_conf: Mapping[str, Any] | None) -> ConfigValues:
        """The values of `exp_conf` (a config dict, or None); a section that is not a mapping
        (a config only loaded, never validated: a checkpoint's) reads as absent."""
        conf = exp_conf or {}

        def section(key: str) -> Mapping[str, Any]:
            value = conf.get(key)
            return value if isinstance(value, Mapping) else {}

        searcher = section("searcher")
        storage = conf.get("checkpoint_storage")
        return cls(
            searcher_metric=searcher.get("metric"),
            smaller_is_better=bool(searcher.get("smaller_is_better", True)),
            checkpoint_storage=storage if isinstance(storage, Mapping) else None,
            experiment_seed=section("reproducibility").get("experiment_seed"),
            aggregation_frequency=section("optimizations").get("aggregation_frequency", 1) or 1,
            max_length=searcher.get("max_length"),
            min_validation_period=conf.get("min_validation_period"),
            global_batch_size=section("hyperparameters").get("global_batch_size"),
        )

    @property
    def checkpoint_host_dir(self) -> pathlib.Path | None:
        """The folder a `shared_fs` section's `host_path` / `storage_path` name, if any."""
        storage = self.checkpoint_storage or {}
        if not storage.get("host_path"):
            return None
        return pathlib.Path(storage["host_path"]) / (storage.get("storage_path") or "")


@dataclasses.dataclass(frozen=True)
class ContextSetup:
    """How the context was built for its run (fixed from then on).

    `run_dir` holds the run's logs; `code_dir` is the folder checkpoints carry a copy of (None:
    no `code/` copy); `processes` share the global batch (the slots, else the distributed
    size); the optimizers step every `aggregation_frequency` batches.
    """

    run_dir: pathlib.Path
    code_dir: pathlib.Path | None
    processes: int
    aggregation_frequency: int


class FitView(Protocol):
    """What the context reads of the fit running its trial (the fit owns all of it)."""

    @property
    def current_batch(self) -> int | None:
        """The index of the batch being (or last) trained; None before the first."""

    @property
    def epoch_length(self) -> int | None:
        """Batches per epoch; None until the training data is built."""

    @property
    def in_train_batch(self) -> bool:
        """Whether the trial's `train_batch` is running."""

    @property
    def start_batch(self) -> int:
        """The batch the fit started from (a continued run's batches trained)."""

    @property
    def driver(self) -> StepDriver | None:
        """The engine running backward passes and optimizer steps."""


def attach_fit(context: PyTorchTrialContext, fit: FitView) -> None:
    """Let `context` read `fit`'s progress (the fit driving its trial, from now on)."""
    context._fit = fit


def config_values(context: PyTorchTrialContext) -> ConfigValues:
    """What the fit reads of `context`'s experiment config, read once when it was built."""
    return context._config_values


def context_setup(context: PyTorchTrialContext) -> ContextSetup:
    """How `context` was built: its folders, processes and aggregation frequency."""
    return context._setup


def trial_scaler(context: PyTorchTrialContext) -> Any:
    """The gradient scaler the trial gave `wrap_scaler` (None without one)."""
    return context._scaler


def profiler_options(context: PyTorchTrialContext) -> dict[str, Any] | None:
    """The `torch.profiler` arguments given to `set_profiler` (None: not called)."""
    options = context._profiler_kwargs
    return None if options is None else dict(options)


def checkpoint_configs(context: PyTorchTrialContext) -> dict[str, Any]:
    """What a checkpoint's load data records of the trial's config: the experiment config and
    hyperparameters when both were given (a trial rebuilt from the checkpoint gets them
    back), else neither."""
    both = context._exp_conf is not None and context._hparams is not None
    return {
        "experiment_config": context._exp_conf if both else None,
        "hparams": context._hparams if both else None,
    }


def close_tensorboard_writer(context: PyTorchTrialContext) -> None:
    """Close the writer `get_tensorboard_writer` opened, if any (the run is over)."""
    if context._tb_writer is not None:
        context._tb_writer.close()


def step_lr_schedulers(context: PyTorchTrialContext, batch_idx: int, epoch_len: int) -> None:
    """Step the wrapped LR schedulers after batch `batch_idx`, by their step modes (on the
    batches where the optimizers step)."""
    if not context._should_communicate_and_update():
        return
    for sched in context.lr_schedulers:
        count = step_count(
            sched._step_mode,
            sched._frequency,
            batch_idx,
            context._setup.aggregation_frequency,
            epoch_len,
        )
        for _ in range(count):
            sched.step()


# Determined's private attributes that trials read, kept with Determined's values (read through
# the context; dotted names through its `distributed` / `experimental` parts).
DETERMINED_PRIVATE_NAMES = (
    "_aggregation_frequency",
    "_epoch_len",
    "_current_batch_idx",
    "_hparams",
    "_exp_conf",
    "_trial_seed",
    "_per_slot_batch_size",
    "_global_batch_size",
    "_scaler",
    "_use_apex",
    "_stop_requested",
    "_enable_tensorboard_logging",
    "distributed._is_chief",
    "distributed._is_local_chief",
    "experimental._auto_amp",
    "experimental._data_repro_checks_disabled",
    "experimental._auto_to_device",
)

# The private attributes of Determined's context the bridge does not keep, and what to use.
_NOT_KEPT = {
    "_core": "Determined's Core API (reporting to a master) is not mapped onto the bridge",
    "_num_gpus": "read context.device (a GPU when its type is 'cuda')",
    "_steps_completed": "call context.get_initial_batch()",
    "_main_model": "read context.models",
    "_wrapped_models": "read context.models",
    "_optimizer_configs": "read context.optimizers",
    "_tbd_writer": "call context.get_tensorboard_writer()",
    "_distributed_backend": "read context.distributed",
    "_managed_training": "the bridge always manages training",
    "_debug_enabled": "the bridge has no debug mode; set the log level instead",
    "_fp16_compression_default": "the bridge does not compress gradients",
    "_average_aggregated_gradients_default": "pass average_aggregated_gradients to "
    "wrap_optimizer()",
    "_loss_ids": "apex is not used",
    "_last_backward_batch_idx": "apex is not used",
    "_is_pre_trainer": "the bridge runs the Trainer API",
    "_last_tb_reset_ts": "the bridge writes TensorBoard files directly",
    "_to_device_warned_types": "internal to Determined's to_device()",
}


class _FitValue:
    """A read-only attribute of Determined's context whose value comes from the running fit;
    writing it says what sets it instead."""

    def __init__(self, read: Callable[[PyTorchTrialContext], Any], set_by: str) -> None:
        self._read = read
        self._set_by = set_by

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: PyTorchTrialContext | None, owner: type) -> Any:
        return self if instance is None else self._read(instance)

    def __set__(self, instance: PyTorchTrialContext, value: Any) -> None:
        raise InvalidTrialError(f"context.{self._name} is read-only: {self._set_by}.")


class PyTorchTrialContext:
    """The trial's view of the run: hyperparameters, config, distributed info and wrappers."""

    # ----- Determined's private attributes trials read (`DETERMINED_PRIVATE_NAMES`) -----

    _aggregation_frequency = _FitValue(
        lambda ctx: context_setup(ctx).aggregation_frequency,
        "pass aggregation_frequency to init() (optimizations.aggregation_frequency in the "
        "experiment config)",
    )
    _epoch_len = _FitValue(
        lambda ctx: ctx._fit.epoch_length if ctx._fit is not None else None,
        "the training data loader's batches per epoch, None until the fit builds it",
    )
    _current_batch_idx = _FitValue(
        lambda ctx: ctx._fit.current_batch if ctx._fit is not None else None,
        "the index of the batch the fit trains (or last trained), None before the first",
    )
    _use_apex = _FitValue(
        lambda ctx: False,
        "apex is never used; configure_apex_amp() runs native AMP (context.experimental._auto_amp)",
    )

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the context does not have.
        hint = _NOT_KEPT.get(name)
        if hint is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise AttributeError(
            f"context.{name} is private state of Determined's context that lightning_bridge "
            f"does not keep: {hint}. The private attributes it keeps, with Determined's values: "
            f"{', '.join(DETERMINED_PRIVATE_NAMES)}."
        )

    def __init__(
        self,
        hparams: dict[str, Any] | None,
        exp_conf: dict[str, Any] | None,
        distributed: DistributedContext,
        aggregation_frequency: int = 1,
        enable_tensorboard_logging: bool = True,
        trial_seed: int | None = None,
        device: torch.device | None = None,
        run_dir: pathlib.Path | None = None,
        slots: int | None = None,
        code_dir: pathlib.Path | None = None,
        config_values: ConfigValues | None = None,
    ) -> None:
        if (
            isinstance(aggregation_frequency, bool)
            or not isinstance(aggregation_frequency, int)
            or aggregation_frequency < 1
        ):
            raise InvalidArgumentError(
                f"aggregation_frequency must be an int >= 1; got {aggregation_frequency!r}."
            )
        if hparams is not None and not isinstance(hparams, dict):
            raise InvalidArgumentError(f"hparams must be a dict; got {type(hparams).__name__}.")
        if exp_conf is not None and not isinstance(exp_conf, dict):
            raise InvalidArgumentError(f"exp_conf must be a dict; got {type(exp_conf).__name__}.")
        self.distributed = distributed
        self._hparams = hparams
        self._exp_conf = exp_conf
        # The config's values a fit reads (`config_values`); `init()` read them already.
        self._config_values = (
            config_values if config_values is not None else ConfigValues.of(exp_conf)
        )
        self._enable_tensorboard_logging = enable_tensorboard_logging
        self._trial_seed = trial_seed
        self.device = device if device is not None else torch.device("cpu")
        self._setup = ContextSetup(
            run_dir=run_dir if run_dir is not None else pathlib.Path.cwd(),
            code_dir=code_dir,
            processes=max(slots or distributed.size, 1),
            aggregation_frequency=aggregation_frequency,
        )
        self._per_slot_batch_size, self._global_batch_size = split_batch_size(
            hparams, self._setup.processes
        )

        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self._average_aggregated: dict[int, bool] = {}
        self._reducers = ReducerRegistry(self.distributed.allgather)
        self.experimental = PyTorchExperimentalContext(self)
        self._warned_types: set[type] = set()
        self._stop_requested = False
        self._profiler_kwargs: dict[str, Any] | None = None
        self._tb_writer: Any = None
        self._scaler: Any = None

        # The fit driving the trial (see `attach_fit`); None before one.
        self._fit: FitView | None = None

    # ----- configuration accessors -----

    def get_hparams(self) -> dict[str, Any]:
        if self._hparams is None:
            raise InvalidArgumentError(
                "No hyperparameters were given: pass them with "
                "lightning_bridge.init(hparams={...})."
            )
        return self._hparams

    def get_hparam(self, name: str) -> Any:
        hparams = self.get_hparams()
        if name not in hparams:
            raise InvalidArgumentError(
                f"Hyperparameter {name!r} is not set; the hyperparameters are "
                f"{sorted(hparams)}. Add {name!r} to the hparams passed to init() (or the "
                "experiment config's hyperparameters section)."
            )
        return hparams[name]

    def get_experiment_config(self) -> dict[str, Any]:
        if self._exp_conf is None:
            raise InvalidArgumentError(
                "No experiment config was given: pass it with "
                "lightning_bridge.init(exp_conf={...})."
            )
        return self._exp_conf

    def get_data_config(self) -> dict[str, Any]:
        return dict(self.get_experiment_config().get("data", {}) or {})

    def get_global_batch_size(self) -> int:
        if self._global_batch_size is None:
            raise InvalidArgumentError(
                "global_batch_size is not set: add it to the hparams given to init()."
            )
        return self._global_batch_size

    def get_per_slot_batch_size(self) -> int:
        if self._per_slot_batch_size is None:
            raise InvalidArgumentError(
                "global_batch_size is not set: add it to the hparams given to init()."
            )
        return self._per_slot_batch_size

    def get_trial_seed(self) -> int:
        if self._trial_seed is None:
            raise InvalidArgumentError(
                "No trial seed is set; set reproducibility.experiment_seed in the experiment "
                "config."
            )
        return self._trial_seed

    def get_experiment_id(self) -> int:
        return 0

    def get_trial_id(self) -> int:
        return 0

    def get_initial_batch(self) -> int:
        return self._fit.start_batch if self._fit is not None else 0

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask the run to stop at the next boundary; the bridge checkpoints, then exits."""
        if not isinstance(stop_requested, bool):
            raise InvalidArgumentError(
                f"set_stop_requested() takes True or False; got {stop_requested!r}."
            )
        if stop_requested:
            logger.info("Stop requested: training stops at the next reporting boundary.")
        self._stop_requested = stop_requested

    def get_enable_tensorboard_logging(self) -> bool:
        return self._enable_tensorboard_logging

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        if not isinstance(enable_tensorboard_logging, bool):
            raise InvalidArgumentError("set_enable_tensorboard_logging() takes True or False.")
        self._enable_tensorboard_logging = enable_tensorboard_logging

    # ----- training progress -----

    def _require_started(self) -> int:
        fit = self._fit
        batch = fit.current_batch if fit is not None else None
        if batch is None:
            raise InvalidTrialError("Training has not started yet: call this from train_batch().")
        return batch

    def _require_epoch_len(self) -> int:
        fit = self._fit
        epoch_len = fit.epoch_length if fit is not None else None
        if not epoch_len:
            raise InvalidTrialError("The training data loader is not built yet.")
        return epoch_len

    def current_train_batch(self) -> int:
        return self._require_started()

    def current_train_epoch(self) -> int:
        return self._require_started() // self._require_epoch_len()

    def is_epoch_start(self) -> bool:
        return self._require_started() % self._require_epoch_len() == 0

    def is_epoch_end(self) -> bool:
        epoch_len = self._require_epoch_len()
        return self._require_started() % epoch_len == epoch_len - 1

    def _should_communicate_and_update(self) -> bool:
        return (self._require_started() + 1) % self._setup.aggregation_frequency == 0

    # ----- wrapping -----

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Register a model; it is moved to the device and checkpointed with the trial."""
        if not isinstance(model, torch.nn.Module):
            raise InvalidTrialError(
                f"wrap_model() takes a torch.nn.Module; got {type(model).__name__}."
            )
        model = model.to(self.device)
        self.models.append(model)
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        backward_passes_per_step: int = 1,
        fp16_compression: bool | None = None,
        average_aggregated_gradients: bool | None = None,
    ) -> torch.optim.Optimizer:
        """Register an optimizer; step it with `step_optimizer` in `train_batch`."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidTrialError(
                f"wrap_optimizer() takes a torch.optim.Optimizer; got {type(optimizer).__name__}."
            )
        if backward_passes_per_step < 1:
            raise InvalidTrialError(
                f"backward_passes_per_step must be >= 1; got {backward_passes_per_step}."
            )
        self._average_aggregated[id(optimizer)] = (
            True if average_aggregated_gradients is None else bool(average_aggregated_gradients)
        )
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(
        self,
        lr_scheduler: Any,
        step_mode: LRScheduler.StepMode,
        frequency: int = 1,
    ) -> Any:
        """Register an LR scheduler stepped by the bridge according to `step_mode`."""
        # Determined's own StepMode members (a trial importing determined.pytorch) count.
        step_mode = as_bridge_enum(step_mode, LRScheduler.StepMode)
        if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and (
            step_mode is not LRScheduler.StepMode.MANUAL_STEP
        ):
            raise InvalidTrialError(
                "ReduceLROnPlateau needs a metric to step, so wrap it with "
                "step_mode=LRScheduler.StepMode.MANUAL_STEP and step it yourself, e.g. from a "
                "PyTorchCallback's on_validation_end(metrics)."
            )
        opt = getattr(lr_scheduler, "optimizer", None)
        if opt is not None and not any(opt is o for o in self.optimizers):
            raise InvalidTrialError(
                "The LR scheduler's optimizer was not wrapped: call "
                "context.wrap_optimizer(optimizer) first and build the scheduler on the "
                "optimizer it returns."
            )
        self.lr_schedulers.append(LRScheduler(lr_scheduler, step_mode, frequency))
        return lr_scheduler

    def wrap_reducer(
        self,
        reducer: Callable | MetricReducer,
        name: str | None = None,
        for_training: bool = True,
        for_validation: bool = True,
    ) -> Any:
        """Register a custom metric reducer (a function of all values, or a MetricReducer)."""
        return self._reducers.wrap_reducer(reducer, name, for_training, for_validation)

    def reset_reducers(self) -> None:
        self._reducers.reset()

    def reduce_metrics(self, for_training: bool) -> dict[str, Any]:
        return self._reducers.reduce(for_training)

    def wrap_scaler(self, scaler: Any) -> Any:
        """Use the trial's own gradient scaler: it scales losses, the bridge steps through it."""
        if self._scaler is not None or self.experimental._auto_amp:
            raise InvalidTrialError("Call wrap_scaler() or use_amp() once, not both or twice.")
        if self.models:
            raise InvalidTrialError("Call wrap_scaler() before wrap_model().")
        self._scaler = check_scaler(scaler)
        return scaler

    def configure_apex_amp(
        self,
        models: Any,
        optimizers: Any = None,
        enabled: bool = True,
        opt_level: str = "O1",
        **kwargs: Any,
    ) -> Any:
        """apex.amp is unmaintained: this runs native AMP (as `use_amp()`) instead."""
        warn_once(
            "apex",
            "configure_apex_amp(): apex is unmaintained; lightning_bridge uses native AMP "
            f"(Lightning's 16-mixed precision) instead of apex opt_level={opt_level!r}.",
        )
        if enabled:
            self.experimental.use_amp()
        return models if optimizers is None else (models, optimizers)

    def autocast_forward_pass(self, to_wrap: torch.nn.Module) -> torch.nn.Module:
        """`to_wrap` with its forward under autocast (GPU only, as in Determined)."""
        return autocast_forward(to_wrap, self.device)

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Profile training with Lightning's PyTorch profiler (arguments of torch.profiler)."""
        if args:
            raise InvalidArgumentError(
                "set_profiler() takes keyword arguments of torch.profiler.profile, e.g. "
                "set_profiler(schedule=torch.profiler.schedule(wait=1, warmup=1, active=2))."
            )
        self._profiler_kwargs = dict(kwargs)

    # ----- data and devices -----

    def to_device(self, data: Any) -> Any:
        return to_device(data, self.device, self._warned_types)

    def get_tensorboard_path(self) -> pathlib.Path:
        return self._setup.run_dir / "tensorboard"

    def get_tensorboard_writer(self) -> Any:
        """A `SummaryWriter` writing beside the run's TensorBoard logs."""
        if self._tb_writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise InvalidArgumentError(
                    "get_tensorboard_writer() needs the tensorboard package: "
                    "pip install tensorboard"
                ) from exc
            self._tb_writer = SummaryWriter(str(self.get_tensorboard_path()))
        return self._tb_writer

    # ----- backward and optimizer steps -----

    def backward(
        self,
        loss: torch.Tensor,
        gradient: torch.Tensor | None = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """Backward pass through the strategy and precision plugin (as `Tensor.backward`)."""
        fit = self._fit
        if fit is None or not fit.in_train_batch:
            raise InvalidTrialError(
                "context.backward() was called outside train_batch(); compute gradients only "
                "inside train_batch()."
            )
        kwargs = {"gradient": gradient, "retain_graph": retain_graph, "create_graph": create_graph}
        driver = fit.driver
        if driver is not None:
            driver.run_backward(loss, self._should_communicate_and_update(), **kwargs)
        else:
            loss.backward(**kwargs)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[Iterator], None] | None = None,
        auto_zero_grads: bool = True,
        scaler: Any = None,
    ) -> None:
        """Step a wrapped optimizer (every `aggregation_frequency` batches), clipping first."""
        # Keyed by id: every wrapped optimizer stays referenced by `self.optimizers`.
        average = self._average_aggregated.get(id(optimizer))
        if average is None:
            raise InvalidTrialError(
                f"step_optimizer() got {type(optimizer).__name__} that was not returned by "
                "context.wrap_optimizer(); wrap the optimizer in __init__ "
                "(self.opt = context.wrap_optimizer(opt)) and step that object."
            )
        scaler = scaler if scaler is not None else self._scaler
        if self._setup.aggregation_frequency > 1 and not auto_zero_grads:
            raise InvalidTrialError(
                "With aggregation_frequency > 1 gradients must be zeroed by the bridge: "
                "call step_optimizer(..., auto_zero_grads=True)."
            )
        if not self._should_communicate_and_update():
            return
        divisor = self._setup.aggregation_frequency if average else 1
        if scaler is not None:
            # The trial's own scaler (wrap_scaler): step through it, skipping inf/NaN steps.
            prepare_step(optimizer, clip_grads, divisor)
            scaler.step(optimizer)
        elif (driver := self._fit.driver if self._fit is not None else None) is not None:
            driver.run_step(optimizer, clip_grads, divisor)
        else:
            prepare_step(optimizer, clip_grads, divisor)
            optimizer.step()
        if auto_zero_grads:
            optimizer.zero_grad()
