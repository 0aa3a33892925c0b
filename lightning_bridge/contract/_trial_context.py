"""`TrialContext`: what every trial's context answers, whatever engine trains the trial.

`PyTorchTrialContext` (wrapping models and optimizers for Lightning's strategies) and
`DeepSpeedTrialContext` (holding the engines a trial built with `deepspeed.initialize`) both
answer Determined's accessors of the run: the hyperparameters and config, the batch sizes,
ids and seed, the distributed layout, the fit's progress (read through one read-only view of
the fit, `FitView`, attached with `attach_fit`), the stop request, TensorBoard, moving data to
the device and the metric reducers. This class owns them once; each context adds what its
engine needs.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract._data import to_device
from lightning_bridge.contract._distributed import DistributedContext, split_batch_size
from lightning_bridge.contract._reducer import MetricReducer, ReducerRegistry

if TYPE_CHECKING:
    from lightning_bridge.contract._step import StepDriver

logger = logging.getLogger("lightning_bridge")


class FitView(Protocol):
    """What a context reads of the fit running its trial (the fit owns all of it)."""

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
        """The engine running backward passes and optimizer steps (None: the trial's own
        engines step themselves)."""


def attach_fit(context: TrialContext, fit: FitView) -> None:
    """Let `context` read `fit`'s progress (the fit driving its trial, from now on)."""
    context._fit = fit


def close_tensorboard_writer(context: TrialContext) -> None:
    """Close the writer `get_tensorboard_writer` opened, if any (the run is over)."""
    if context._tb_writer is not None:
        context._tb_writer.close()


class TrialContext:
    """The run as a trial sees it: configuration, layout, progress, stop request, TensorBoard,
    devices and reducers (see the module docstring)."""

    # The call that builds the context, named where a value it takes is missing.
    _init_call = "lightning_bridge.init"

    def __init__(
        self,
        hparams: dict[str, Any] | None,
        exp_conf: dict[str, Any] | None,
        distributed: DistributedContext,
        *,
        processes: int,
        device: torch.device | None = None,
        trial_seed: int | None = None,
        enable_tensorboard_logging: bool = True,
        tensorboard_dir: pathlib.Path | None = None,
    ) -> None:
        if hparams is not None and not isinstance(hparams, dict):
            raise InvalidArgumentError(f"hparams must be a dict; got {type(hparams).__name__}.")
        if exp_conf is not None and not isinstance(exp_conf, dict):
            raise InvalidArgumentError(f"exp_conf must be a dict; got {type(exp_conf).__name__}.")
        self.distributed = distributed
        self.device = device if device is not None else torch.device("cpu")
        self._hparams = hparams
        self._exp_conf = exp_conf
        self._trial_seed = trial_seed
        # The global batch is shared by `processes` (the slots, else the distributed size).
        self._per_slot_batch_size, self._global_batch_size = split_batch_size(hparams, processes)
        self._enable_tensorboard_logging = enable_tensorboard_logging
        # Where `get_tensorboard_writer` writes: the run's TensorBoard folder.
        self._tensorboard_dir = (
            tensorboard_dir if tensorboard_dir is not None else pathlib.Path("tensorboard")
        )
        self._tb_writer: Any = None
        self._stop_requested = False
        self._reducers = ReducerRegistry(distributed.allgather)
        self._warned_types: set[type] = set()
        # The fit driving the trial (see `attach_fit`); None before one.
        self._fit: FitView | None = None

    # ----- configuration -----

    def get_hparams(self) -> dict[str, Any]:
        if self._hparams is None:
            raise InvalidArgumentError(
                f"No hyperparameters were given: pass them with {self._init_call}(hparams={{...}})."
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
                f"No experiment config was given: pass it with {self._init_call}(exp_conf={{...}})."
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

    # ----- stop request -----

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

    # ----- TensorBoard -----

    def get_enable_tensorboard_logging(self) -> bool:
        return self._enable_tensorboard_logging

    def set_enable_tensorboard_logging(self, enable_tensorboard_logging: bool) -> None:
        if not isinstance(enable_tensorboard_logging, bool):
            raise InvalidArgumentError("set_enable_tensorboard_logging() takes True or False.")
        self._enable_tensorboard_logging = enable_tensorboard_logging

    def get_tensorboard_path(self) -> pathlib.Path:
        return self._tensorboard_dir

    def get_tensorboard_writer(self) -> Any:
        """A `SummaryWriter` writing into the run's TensorBoard folder (the same for every
        call; closed when the run ends)."""
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

    # ----- training progress -----

    def get_initial_batch(self) -> int:
        return self._fit.start_batch if self._fit is not None else 0

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

    # ----- data and metrics -----

    def to_device(self, data: Any) -> Any:
        return to_device(data, self.device, self._warned_types)

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
