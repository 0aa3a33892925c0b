"""`DeepSpeedTrial` and `DeepSpeedTrialContext`: Determined's DeepSpeed trial contract.

A DeepSpeed trial builds its engines itself with `deepspeed.initialize` and hands them to the
context (`wrap_model_engine`); the engine owns the optimizer, the LR scheduler, ZeRO and the
precision, so the context has no `wrap_optimizer` (as in Determined 0.38.1). `train_batch`
receives the training iterator, not a batch: the runner calls it once per micro batch
(`gradient_accumulation_steps` times per batch) unless the trial disabled that, and a pipeline
engine draws its micro batches from the iterator itself (`engine.train_batch(iter)`).

Nothing here imports DeepSpeed: the engines are the trial's, recognised by duck typing.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import json
import logging
import pathlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract._data import data_length, to_device
from lightning_bridge.contract._distributed import DistributedContext, split_batch_size
from lightning_bridge.contract._reducer import MetricReducer, Reducer, ReducerRegistry

if TYPE_CHECKING:
    from lightning_bridge.contract._callback import PyTorchCallback
    from lightning_bridge.contract._context import FitView

logger = logging.getLogger("lightning_bridge")


@dataclasses.dataclass
class ModelParallelUnit:
    """How this process takes part in data parallelism, and whether it builds data loaders and
    reports metrics (ranks of a pipeline's middle stages do neither)."""

    data_parallel_rank: int
    data_parallel_world_size: int
    should_report_metrics: bool
    should_build_data_loader: bool


def make_data_parallel_mpu(distributed: DistributedContext) -> ModelParallelUnit:
    """Every process is a data-parallel replica: it builds loaders and reports metrics."""
    return ModelParallelUnit(
        data_parallel_rank=distributed.get_rank(),
        data_parallel_world_size=distributed.get_size(),
        should_report_metrics=True,
        should_build_data_loader=True,
    )


def make_deepspeed_mpu(topology: Any) -> ModelParallelUnit:
    """The unit of a DeepSpeed `PipelineParallelGrid`: the first and last stages build the data
    loaders (the first feeds inputs, the last labels)."""
    stage = topology.get_pipe_parallel_rank()
    last = topology.get_pipe_parallel_world_size() - 1
    return ModelParallelUnit(
        data_parallel_rank=topology.get_data_parallel_rank(),
        data_parallel_world_size=topology.get_data_parallel_world_size(),
        should_report_metrics=True,
        should_build_data_loader=topology.get_slice_parallel_rank() == 0 and stage in (0, last),
    )


def _merged(base: Mapping[Any, Any], source: Mapping[Any, Any]) -> dict[Any, Any]:
    """`base` with `source`'s values put in, depth first, into new dicts."""
    merged = copy.deepcopy(dict(base))
    for key, value in source.items():
        if key in base and isinstance(value, dict) and isinstance(base[key], dict):
            merged[key] = _merged(base[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def merge_dicts(base_dict: dict[Any, Any], source_dict: dict[Any, Any]) -> dict[Any, Any]:
    """Determined's `determined.util.merge_dicts`: `base_dict` with `source_dict`'s values put
    in, depth first; neither input is changed."""
    return _merged(base_dict, source_dict)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InvalidArgumentError(f"The DeepSpeed config repeats the key(s) {dupes}.")
    return dict(pairs)


def overwrite_deepspeed_config(
    base_ds_config: str | pathlib.Path | dict[str, Any], source_ds_dict: dict[str, Any]
) -> dict[str, Any]:
    """A DeepSpeed config: `base_ds_config` (a dict, or the path of a JSON file) with the
    values of `source_ds_dict` (typically the hyperparameters' `overwrite_deepspeed_args`)
    put in, depth first. Neither input is changed."""
    if isinstance(base_ds_config, (str, pathlib.Path)):
        path = pathlib.Path(base_ds_config)
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidArgumentError(
                f"Cannot read the DeepSpeed config {str(path)!r}: {exc.strerror}. Give the path "
                "of a JSON file (relative to the trial's folder) or a dict."
            ) from None
        base = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    elif isinstance(base_ds_config, dict):
        base = base_ds_config
    else:
        raise TypeError("Expected string or dict for base_ds_config argument.")
    return _merged(base, source_ds_dict or {})


def _is_pipeline_engine(engine: Any) -> bool:
    return any(cls.__name__ == "PipelineEngine" for cls in type(engine).__mro__)


class DeepSpeedTrialContext:
    """The trial's view of the run, for a `DeepSpeedTrial`: hyperparameters, config,
    distributed info, the engines it wrapped, its micro-batch settings and reducers."""

    def __init__(
        self,
        hparams: dict[str, Any] | None,
        exp_conf: dict[str, Any] | None,
        distributed: DistributedContext,
        device: torch.device | None = None,
        trial_seed: int | None = None,
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
        self._per_slot_batch_size, self._global_batch_size = split_batch_size(
            hparams, max(distributed.size, 1)
        )
        self.models: list[Any] = []
        self._mpu = make_data_parallel_mpu(distributed)
        self._called_set_mpu = False
        self._micro_batch_size: int | None = None
        self._micro_batches: int | None = None
        self._use_pipeline_parallel = False
        self._data_repro_checks_disabled = False
        self._manual_grad_accumulation = False
        self._stop_requested = False
        self._reducers = ReducerRegistry(distributed.allgather)
        self._warned_types: set[type] = set()
        # The fit running the trial (its progress), attached by the runner.
        self._fit: FitView | None = None
        self._tensorboard_logging = True
        # Where `get_tensorboard_writer` writes: the run's folder, set by `init()`.
        self._tensorboard_dir = pathlib.Path("tensorboard")
        self._tb_writer: Any = None

    # ----- engines -----

    def wrap_model_engine(self, model: Any) -> Any:
        """Register a DeepSpeed engine: it is checkpointed, and the first one sets the micro
        batch size and the number of micro batches per batch (its gradient accumulation)."""
        if not all(hasattr(model, a) for a in ("train_micro_batch_size_per_gpu", "backward")):
            raise InvalidTrialError(
                f"wrap_model_engine() takes a DeepSpeed engine (the first value "
                f"deepspeed.initialize() returns); got {type(model).__name__}."
            )
        model = model.to(self.device)
        if _is_pipeline_engine(model):
            self._use_pipeline_parallel = True
            if not self.models:
                self._mpu = make_deepspeed_mpu(model.mpu)
        if not self.models:
            self._micro_batch_size = int(model.train_micro_batch_size_per_gpu())
            self._micro_batches = int(model.gradient_accumulation_steps())
        elif model.train_micro_batch_size_per_gpu() != self._micro_batch_size:
            logger.warning(
                "Engine %d's train micro batch size differs from the first engine's; the "
                "records trained are counted with the first engine's.",
                len(self.models) + 1,
            )
        self.models.append(model)
        return model

    def set_mpu(self, mpu: ModelParallelUnit) -> None:
        """Use a custom model-parallel layout (after `wrap_model_engine`, once)."""
        if not self.models:
            raise InvalidTrialError("Call wrap_model_engine() before set_mpu().")
        if self._called_set_mpu:
            raise InvalidTrialError("set_mpu() may be called once per trial.")
        self._called_set_mpu = True
        self._mpu = mpu

    @property
    def mpu(self) -> ModelParallelUnit:
        return self._mpu

    def disable_auto_grad_accumulation(self) -> None:
        """`train_batch` trains all of a batch's micro batches itself: it is called once per
        batch instead of `gradient_accumulation_steps` times."""
        self._manual_grad_accumulation = True

    def disable_dataset_reproducibility_checks(self) -> None:
        """Allow any loader from the data loader builders, not only `DataLoader`."""
        self._data_repro_checks_disabled = True

    @property
    def use_pipeline_parallel(self) -> bool:
        return self._use_pipeline_parallel

    def get_train_micro_batch_size_per_gpu(self) -> int:
        if self._micro_batch_size is None:
            raise InvalidTrialError(
                "Call wrap_model_engine() before get_train_micro_batch_size_per_gpu()."
            )
        return self._micro_batch_size

    def get_num_micro_batches_per_slot(self) -> int:
        if self._micro_batches is None:
            raise InvalidTrialError(
                "Call wrap_model_engine() before get_num_micro_batches_per_slot()."
            )
        return self._micro_batches

    # ----- configuration -----

    def get_hparams(self) -> dict[str, Any]:
        if self._hparams is None:
            raise InvalidArgumentError(
                "No hyperparameters were given: pass them with deepspeed.init(hparams={...})."
            )
        return self._hparams

    def get_hparam(self, name: str) -> Any:
        hparams = self.get_hparams()
        if name not in hparams:
            raise InvalidArgumentError(
                f"Hyperparameter {name!r} is not set; the hyperparameters are "
                f"{sorted(hparams)}. Add it to the experiment config's hyperparameters."
            )
        return hparams[name]

    def get_experiment_config(self) -> dict[str, Any]:
        if self._exp_conf is None:
            raise InvalidArgumentError(
                "No experiment config was given: pass it with deepspeed.init(exp_conf={...})."
            )
        return self._exp_conf

    def get_data_config(self) -> dict[str, Any]:
        return dict((self._exp_conf or {}).get("data", {}) or {})

    def get_global_batch_size(self) -> int:
        if self._global_batch_size is None:
            raise InvalidArgumentError("global_batch_size is not set in the hyperparameters.")
        return self._global_batch_size

    def get_per_slot_batch_size(self) -> int:
        if self._per_slot_batch_size is None:
            raise InvalidArgumentError("global_batch_size is not set in the hyperparameters.")
        return self._per_slot_batch_size

    def get_trial_seed(self) -> int:
        if self._trial_seed is None:
            raise InvalidArgumentError(
                "No trial seed is set; set reproducibility.experiment_seed in the config."
            )
        return self._trial_seed

    def get_experiment_id(self) -> int:
        return 0

    def get_trial_id(self) -> int:
        return 0

    def get_initial_batch(self) -> int:
        return self._fit.start_batch if self._fit is not None else 0

    def get_enable_tensorboard_logging(self) -> bool:
        return self._tensorboard_logging

    def get_tensorboard_path(self) -> pathlib.Path:
        return self._tensorboard_dir

    def get_tensorboard_writer(self) -> Any:
        """A `SummaryWriter` writing into the run's TensorBoard folder (the same for every
        call; closed when the fit ends)."""
        if self._tb_writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise InvalidArgumentError(
                    "get_tensorboard_writer() needs the tensorboard package: "
                    "pip install tensorboard"
                ) from exc
            self._tb_writer = SummaryWriter(str(self._tensorboard_dir))
        return self._tb_writer

    def _close_tensorboard_writer(self) -> None:
        if self._tb_writer is not None:
            self._tb_writer.close()

    @property
    def optimizers(self) -> list[Any]:
        """None wrapped: each engine owns its optimizer (checkpointed with the engine)."""
        return []

    def get_stop_requested(self) -> bool:
        return self._stop_requested

    def set_stop_requested(self, stop_requested: bool) -> None:
        if not isinstance(stop_requested, bool):
            raise InvalidArgumentError("set_stop_requested() takes True or False.")
        self._stop_requested = stop_requested

    # ----- progress -----

    def _epoch_len(self) -> int:
        length = self._fit.epoch_length if self._fit is not None else None
        if not length:
            raise InvalidTrialError("The training data loader is not built yet.")
        return length

    def current_train_batch(self) -> int:
        batch = self._fit.current_batch if self._fit is not None else None
        if batch is None:
            raise InvalidTrialError("Training has not started yet: call this from train_batch().")
        return batch

    def current_train_epoch(self) -> int:
        return self.current_train_batch() // self._epoch_len()

    def is_epoch_start(self) -> bool:
        return self.current_train_batch() % self._epoch_len() == 0

    def is_epoch_end(self) -> bool:
        length = self._epoch_len()
        return self.current_train_batch() % length == length - 1

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


class DeepSpeedTrial(metaclass=abc.ABCMeta):
    """Base class of DeepSpeed trials: build engines with `deepspeed.initialize` in
    `__init__` and wrap them; `train_batch` and `evaluate_batch` draw from iterators."""

    @abc.abstractmethod
    def __init__(self, context: DeepSpeedTrialContext) -> None:
        """Build the engines and wrap them with `context.wrap_model_engine`."""

    @abc.abstractmethod
    def train_batch(
        self, dataloader_iter: Iterator[Any] | None, epoch_idx: int, batch_idx: int
    ) -> torch.Tensor | dict[str, Any]:
        """Train one micro batch (or, for a pipeline engine, one batch) from the iterator."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Any:
        """A `DataLoader` of micro batches (`train_micro_batch_size_per_gpu` records)."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Any:
        """A `DataLoader` for validation."""

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        return {}

    def evaluate_batch(self, dataloader_iter: Iterator[Any] | None, batch_idx: int) -> dict:
        """Validation metrics of one batch drawn from the iterator."""
        raise NotImplementedError("override evaluate_batch() or evaluate_full_dataset()")

    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        """Validation metrics over the whole validation loader."""
        raise NotImplementedError("override evaluate_batch() or evaluate_full_dataset()")

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        return Reducer.AVG

    def save(self, context: DeepSpeedTrialContext, path: pathlib.Path) -> None:
        """Save every wrapped engine as `path/model{i}` (DeepSpeed's own layout, `latest`)."""
        for i, engine in enumerate(context.models):
            engine.save_checkpoint(str(path), tag=f"model{i}")

    def load(self, context: DeepSpeedTrialContext, load_path: pathlib.Path) -> None:
        """Load every wrapped engine from `load_path/model{i}`."""
        for i, engine in enumerate(context.models):
            loaded, _ = engine.load_checkpoint(str(load_path), tag=f"model{i}")
            if loaded is None:
                raise InvalidTrialError(f"The checkpoint {load_path} holds no engine model{i}.")

    def get_batch_length(self, batch: Any) -> int:
        return data_length(batch)
