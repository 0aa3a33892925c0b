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
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from lightning_bridge._errors import InvalidArgumentError, InvalidTrialError
from lightning_bridge.contract._data import data_length
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._reducer import Reducer
from lightning_bridge.contract._trial_context import TrialContext

if TYPE_CHECKING:
    from lightning_bridge.contract._callback import PyTorchCallback

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


class DeepSpeedTrialContext(TrialContext):
    """A `DeepSpeedTrial`'s context: the run's accessors (`TrialContext`) and the engines the
    trial wrapped, its model-parallel unit and its micro-batch settings."""

    _init_call = "deepspeed.init"

    def __init__(
        self,
        hparams: dict[str, Any] | None,
        exp_conf: dict[str, Any] | None,
        distributed: DistributedContext,
        device: torch.device | None = None,
        trial_seed: int | None = None,
        tensorboard_dir: pathlib.Path | None = None,
    ) -> None:
        super().__init__(
            hparams,
            exp_conf,
            distributed,
            processes=max(distributed.size, 1),
            device=device,
            trial_seed=trial_seed,
            tensorboard_dir=tensorboard_dir,
        )
        self.models: list[Any] = []
        self._mpu = make_data_parallel_mpu(distributed)
        self._called_set_mpu = False
        self._micro_batch_size: int | None = None
        self._micro_batches: int | None = None
        self._use_pipeline_parallel = False
        self._data_repro_checks_disabled = False
        self._manual_grad_accumulation = False

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

    @property
    def optimizers(self) -> list[Any]:
        """None wrapped: each engine owns its optimizer (checkpointed with the engine)."""
        return []


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
