"""A ported module's validation, as `lightning.Trainer`'s validation loop runs it.

One validation loader is handed to the trainer as it is. Several (a list, tuple or dict from
`val_dataloader()`) run one after another as one loader whose batches carry their loader's
index: `validation_step` and the batch hooks get `dataloader_idx`, and what the module logs
is named `name/dataloader_idx_N`, as Lightning names it. A module without `validation_step`
(or without a validation loader) validates on one empty batch: Lightning runs no validation
for it, and the trial's validation reports the last training epoch's values instead.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.trainer.states import RunningStage

from lightning_bridge.adapter._data import (
    NoValidation,
    Tagged,
    distributed_loader,
    hook_owner,
    loaders_of,
    no_validation_loader,
    sequential_loader,
)
from lightning_bridge.adapter._steps import step_args


class ValidationSteps:
    """Validation of the module (mixed into `AdapterMixin`)."""

    context: Any
    lightning_module: Any
    datamodule: Any
    _trainer: Any
    _log: Any
    _callbacks: Any
    _precision: Any
    _has_validation: bool
    _accumulating: bool
    _several_loaders: bool = False

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _hook(self, hook: str, *args: Any) -> Any:
        raise NotImplementedError

    def _transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def build_validation_data_loader(self) -> Any:
        if not self._has_validation:
            return no_validation_loader()
        owner = hook_owner("val_dataloader", self.lightning_module, self.datamodule)
        returned = (
            self._call("val_dataloader")
            if owner is self.lightning_module
            else owner.val_dataloader()
        )
        dist = self.context.distributed
        loaders = [
            distributed_loader(loader, dist.rank, dist.size, shuffle=False)
            for loader in loaders_of(returned, "val_dataloader", several=True)
        ]
        self._several_loaders = len(loaders) > 1
        return sequential_loader(loaders) if self._several_loaders else loaders[0]

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        if isinstance(batch, NoValidation):
            return {}
        module = self.lightning_module
        dataloader_idx: int | None = None
        if isinstance(batch, Tagged):
            batch, dataloader_idx, batch_idx = batch.batch, batch.dataloader_idx, batch.batch_idx
        self._trainer.state.stage = RunningStage.VALIDATING
        batch = self._transfer(batch, dataloader_idx or 0)
        self._log.start_batch(self._log.val, batch, dataloader_idx)
        extra = () if dataloader_idx is None else (dataloader_idx,)
        self._hook("on_validation_batch_start", batch, batch_idx, *extra)
        with self._precision.val_step_context():
            out = self._call(
                "validation_step",
                *step_args(module.validation_step, batch, batch_idx, dataloader_idx),
            )
        self._hook("on_validation_batch_end", out, batch, batch_idx, *extra)
        self._log.end_batch(self._log.val)
        return {}

    def get_batch_length(self, batch: Any) -> int:
        from lightning.pytorch.utilities.data import extract_batch_size

        if isinstance(batch, NoValidation):
            return 1
        if isinstance(batch, Tagged):
            batch = batch.batch
        return int(extract_batch_size(batch))

    # ----- the moments of a validation (called by the adapter's PyTorchCallback) -----

    def _validation_start(self) -> None:
        if not self._has_validation:
            return
        self._trainer.state.stage = RunningStage.VALIDATING
        if not self._accumulating:
            self._call("on_validation_model_zero_grad")
        self._call("on_validation_model_eval")
        self._hook("on_validation_start")
        self._hook("on_validation_epoch_start")

    def _validation_epoch_end(self) -> None:
        if not self._has_validation:
            return
        self._log.val.dataloader_idx = None
        self._hook("on_validation_epoch_end")
        self._log.finish_validation_epoch()

    def _validation_end(self) -> None:
        if self._has_validation:
            self._hook("on_validation_end")
            self._call("on_validation_model_train")
        self._trainer.state.stage = RunningStage.TRAINING
        # What Lightning runs after a validation: plateau schedulers, the epoch's end.
        self._flush()
