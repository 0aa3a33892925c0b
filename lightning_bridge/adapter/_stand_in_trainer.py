"""The trainer a ported LightningModule sees while it runs as a trial.

A module running under `LightningAdapter` is never attached to a `lightning.Trainer`: the
trial runs on whichever Determined-style `Trainer` drives it. `module.trainer` is a
`StandInTrainer` that answers what modules and callbacks commonly read (epoch and step
counters, phase flags, optimizers and scheduler configs, rank and world size,
`callback_metrics`, the Trainer arguments of `_trainer_arguments` such as `max_epochs` and
`estimated_stepping_batches`, ...), and whose `strategy` routes `manual_backward` and
`optimizer.step()` to the adapter's optimization (`_optimization`), which goes through the trial
context. Anything else fails with a message naming the attribute.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus
from lightning.pytorch.utilities import GradClipAlgorithmType

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.adapter._lightning_packages import package_of
from lightning_bridge.adapter._module_data import TrainingData
from lightning_bridge.adapter._module_log import LogRouter
from lightning_bridge.adapter._trainer_arguments import TrainerSettings
from lightning_bridge.translation._lightning_private import (
    _all_gather_ddp_if_available,
    _sync_ddp_if_available,
    attach_fit_loop,
    set_lightning_optimizers,
)


def distributed() -> bool:
    """Whether a torch process group is running."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class StandInStrategy:
    """`trainer.strategy`: backward and optimizer steps go where `route` says (the adapter's
    optimization, through the trial context); collectives use the process group."""

    handles_gradient_accumulation = False

    def __init__(self, context: Any, module: Any, precision_plugin: Any) -> None:
        self._context = context
        self.lightning_module = self.model = module
        self.precision_plugin = precision_plugin
        set_lightning_optimizers(self, [], package_of(module))
        self._backward: Callable[..., None] | None = None
        self._optimizer_step: Callable[..., Any] | None = None

    def route(self, backward: Callable[..., None], optimizer_step: Callable[..., Any]) -> None:
        """Where `backward` and `optimizer_step` go (set once, by the adapter's run)."""
        self._backward, self._optimizer_step = backward, optimizer_step

    @property
    def root_device(self) -> torch.device:
        return torch.device(self._context.device)

    @property
    def world_size(self) -> int:
        return int(self._context.distributed.size)

    @property
    def global_rank(self) -> int:
        return int(self._context.distributed.rank)

    @property
    def local_rank(self) -> int:
        return int(self._context.distributed.local_rank)

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def backward(
        self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """`manual_backward` and automatic optimization: backward through the context."""
        assert self._backward is not None, "route() first"
        self._backward(closure_loss, *args, **kwargs)
        return closure_loss

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """`LightningOptimizer.step`: run the closure, then step through the context."""
        assert self._optimizer_step is not None, "route() first"
        return self._optimizer_step(optimizer, closure, **kwargs)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or not distributed():
            return tensor
        return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> Any:
        return _all_gather_ddp_if_available(tensor, group=group, sync_grads=sync_grads)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """One decision for every process (EarlyStopping's): all agree, or any says yes."""
        if not distributed():
            return bool(decision)
        total = self.reduce(torch.tensor(int(decision), device=self.root_device), reduce_op="sum")
        return bool(total == self.world_size) if all else bool(total)

    def barrier(self, name: str | None = None) -> None:
        if distributed():
            torch.distributed.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if src != 0:
            raise InvalidTrialError(
                "trainer.strategy.broadcast() under LightningAdapter broadcasts from rank 0 only."
            )
        return self._context.distributed.broadcast(obj)


class StandInTrainer:
    """`module.trainer` for a module running as a trial (see the module docstring)."""

    def __init__(
        self,
        context: Any,
        module: Any,
        datamodule: Any,
        settings: TrainerSettings,
        precision_plugin: Any,
        data: TrainingData,
        log: LogRouter,
    ) -> None:
        self._context = context
        self.lightning_module = self.model = module
        self.datamodule = datamodule
        self._settings = settings
        self._data = data
        self._log = log
        self.strategy = StandInStrategy(context, module, precision_plugin)
        self.precision_plugin = precision_plugin
        self.state = TrainerState(status=TrainerStatus.RUNNING, fn=TrainerFn.FITTING)
        self.state.stage = RunningStage.TRAINING
        self.profiler = PassThroughProfiler()
        self.gradient_clip_val = settings.gradient_clip_val
        algo = settings.gradient_clip_algorithm
        self.gradient_clip_algorithm = None if algo is None else GradClipAlgorithmType(algo)
        self.accumulate_grad_batches = settings.accumulate_grad_batches
        self.val_check_interval = settings.val_check_interval
        self.check_val_every_n_epoch = settings.check_val_every_n_epoch
        self.precision = settings.precision
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[Any] = []
        self.logged_metrics: dict[str, torch.Tensor] = {}
        self.progress_bar_metrics: dict[str, float] = {}
        self.current_epoch = 0
        self.global_step = 0
        self.sanity_checking = False
        self.testing = False
        self.predicting = False
        self.barebones = False
        self.fast_dev_run = False
        self.received_sigterm = False
        self.logger: Any = None
        self.loggers: list[Any] = []
        self.callbacks: list[Any] = []
        self.checkpoint_callback: Any = None
        self.checkpoint_callbacks: list[Any] = []
        self.early_stopping_callback: Any = None
        self.early_stopping_callbacks: list[Any] = []
        self.progress_bar_callback = None
        self.num_nodes = 1
        self.num_devices = 1
        self.node_rank = 0
        self.limit_train_batches = settings.limit_train_batches
        self.limit_val_batches = settings.limit_val_batches
        self.log_every_n_steps = settings.log_every_n_steps
        self.num_sanity_val_steps = 0
        attach_fit_loop(self, lambda: self.global_step, self._should_update_logs)

    def _should_update_logs(self) -> bool:
        """Whether callbacks log now (LearningRateMonitor): with `log_every_n_steps` given,
        Lightning's rule; without it, every step (the trial's reporting period averages)."""
        if not self._settings.log_every_n_steps_given:
            return True
        step = self.global_step + 1
        return step % self.log_every_n_steps == 0 or self.should_stop

    # ----- the trial's length (from the experiment config) -----

    @property
    def num_training_batches(self) -> int | float:
        """Batches per epoch of this process's training loader (built early if needed)."""
        length = self._data.epoch_len()
        return float("inf") if length is None else length

    @property
    def max_epochs(self) -> int:
        return self._settings.max_epochs(self._data.epoch_len())

    @property
    def max_steps(self) -> int:
        return self._settings.max_steps(self._data.epoch_len(), self.accumulate_grad_batches)

    @property
    def estimated_stepping_batches(self) -> int | float:
        return self._settings.estimated_stepping_batches(
            self._data.epoch_len(), self.accumulate_grad_batches
        )

    @property
    def train_dataloader(self) -> Any:
        return self._data.loader()

    # ----- phases -----

    @property
    def training(self) -> bool:
        return self.state.stage == RunningStage.TRAINING

    @training.setter
    def training(self, value: bool) -> None:
        if value:
            self.state.stage = RunningStage.TRAINING

    @property
    def validating(self) -> bool:
        return self.state.stage == RunningStage.VALIDATING

    @validating.setter
    def validating(self, value: bool) -> None:
        if value:
            self.state.stage = RunningStage.VALIDATING

    # ----- processes -----

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    # ----- objects -----

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """What the module logged (step and epoch values, synced where `sync_dist=True`)."""
        return self._log.callback_metrics

    @property
    def default_root_dir(self) -> str:
        return os.getcwd()

    @property
    def log_dir(self) -> str:
        return os.getcwd()

    @property
    def should_stop(self) -> bool:
        return bool(self._context.get_stop_requested())

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        # Determined's way to end training early: the trainer stops at the next boundary.
        self._context.set_stop_requested(bool(value))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"The LightningModule read `self.trainer.{name}`, which a module running as a "
            "Determined trial (LightningAdapter) does not have: the trial has no "
            "lightning.Trainer. Pass the value through the trial's hparams instead; "
            "docs/lightning.md lists what `self.trainer` provides."
        )
