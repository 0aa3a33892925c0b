"""`PyTorchTrialContext`: what a `PyTorchTrial` uses to wrap its objects and step them.

The run's accessors every context shares (config, progress, stop request, TensorBoard,
reducers) are `TrialContext`'s (`_trial_context`). This context adds what the fit's engine
steps: the models, optimizers and LR schedulers a trial wraps, its gradient scaler and AMP,
its profiler options. It forwards `backward` and `step_optimizer` to the fit's `StepDriver`
(through the fit's view, `FitView`), so the backward pass and optimizer steps go through
Lightning's strategy and precision plugin.

The context's own state the fit reads (the config's values: `config_values`; its folders,
processes and aggregation: `context_setup`; the trial's gradient scaler, profiler options and
what a checkpoint records of its config) is read through this module's functions, never its
private attributes. Determined's private attributes trials read are answered as
`_determined_private` says.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract._amp import autocast_forward, check_scaler, warn_once
from lightning_bridge.contract._config_values import ConfigValues
from lightning_bridge.contract._determined_compat import as_bridge_enum
from lightning_bridge.contract._determined_private import FitValue, not_kept
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._experimental import PyTorchExperimentalContext
from lightning_bridge.contract._lr_scheduler import LRScheduler, step_count
from lightning_bridge.contract._step import prepare_step
from lightning_bridge.contract._trial_context import TrialContext

logger = logging.getLogger("lightning_bridge")


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


class PyTorchTrialContext(TrialContext):
    """A `PyTorchTrial`'s context: the run's accessors (`TrialContext`) and the trial's
    models, optimizers, LR schedulers, AMP and profiler, stepped through the fit's engine."""

    # ----- Determined's private attributes trials read (`DETERMINED_PRIVATE_NAMES`) -----

    _aggregation_frequency = FitValue(
        lambda ctx: context_setup(ctx).aggregation_frequency,
        "pass aggregation_frequency to init() (optimizations.aggregation_frequency in the "
        "experiment config)",
    )
    _epoch_len = FitValue(
        lambda ctx: ctx._fit.epoch_length if ctx._fit is not None else None,
        "the training data loader's batches per epoch, None until the fit builds it",
    )
    _current_batch_idx = FitValue(
        lambda ctx: ctx._fit.current_batch if ctx._fit is not None else None,
        "the index of the batch the fit trains (or last trained), None before the first",
    )
    _use_apex = FitValue(
        lambda ctx: False,
        "apex is never used; configure_apex_amp() runs native AMP (context.experimental._auto_amp)",
    )

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the context does not have.
        raise not_kept(self, name)

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
        setup = ContextSetup(
            run_dir=run_dir if run_dir is not None else pathlib.Path.cwd(),
            code_dir=code_dir,
            processes=max(slots or distributed.size, 1),
            aggregation_frequency=aggregation_frequency,
        )
        super().__init__(
            hparams,
            exp_conf,
            distributed,
            processes=setup.processes,
            device=device,
            trial_seed=trial_seed,
            enable_tensorboard_logging=enable_tensorboard_logging,
            tensorboard_dir=setup.run_dir / "tensorboard",
        )
        self._setup = setup
        # The config's values a fit reads (`config_values`); `init()` read them already.
        self._config_values = (
            config_values if config_values is not None else ConfigValues.of(exp_conf)
        )

        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[LRScheduler] = []
        self._average_aggregated: dict[int, bool] = {}
        self.experimental = PyTorchExperimentalContext(self)
        self._profiler_kwargs: dict[str, Any] | None = None
        self._scaler: Any = None

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
