"""The reducers and the `PyTorchCallback` through which a ported module meets the trainer.

Both are built on the classes of the API the trial runs on (`lightning_bridge` or
`determined.pytorch`), since each trainer checks for its own classes. The callback runs the
module's fit, epoch, validation and checkpoint hooks at the trainer's moments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.trainer.states import RunningStage

if TYPE_CHECKING:
    from lightning_bridge.adapter._host import AdapterHost


def adapter_reducer(api: Any, state: Any, reset: Any, combine: Any) -> Any:
    """A `MetricReducer` of `api` (each trainer checks for its own class)."""

    class _Reducer(api.MetricReducer):
        def reset(self) -> None:
            reset()

        def per_slot_reduce(self) -> Any:
            return state()

        def cross_slot_reduce(self, per_slot_metrics: list) -> Any:
            return combine(per_slot_metrics)

    return _Reducer()


def adapter_callback(api: Any, adapter: AdapterHost) -> Any:
    """The `PyTorchCallback` that runs the module's fit, epoch and checkpoint hooks."""
    call, log, trainer = adapter._call, adapter._log, adapter._trainer
    module, dm = adapter.lightning_module, adapter.datamodule

    class _Hooks(api.PyTorchCallback):
        def on_training_start(self) -> None:
            call("on_fit_start")
            call("on_train_start")

        def on_training_epoch_start(self, epoch_idx: int) -> None:
            if adapter._pending_plateau:
                adapter._flush_plateau()
            trainer.current_epoch = epoch_idx
            trainer.state.stage = RunningStage.TRAINING
            call("on_train_epoch_start")

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            call("on_train_epoch_end")
            log.finish_training_epoch()
            adapter._pending_plateau = True

        def on_validation_start(self) -> None:
            trainer.state.stage = RunningStage.VALIDATING
            call("on_validation_model_zero_grad")
            call("on_validation_model_eval")
            call("on_validation_start")

        def on_validation_epoch_start(self) -> None:
            call("on_validation_epoch_start")

        def on_validation_epoch_end(self, outputs: list) -> None:
            call("on_validation_epoch_end")
            log.finish_validation_epoch()

        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            call("on_validation_end")
            call("on_validation_model_train")
            trainer.state.stage = RunningStage.TRAINING
            if adapter._pending_plateau:
                adapter._flush_plateau()

        def on_trial_shutdown(self) -> None:
            call("on_train_end")
            call("on_fit_end")
            if dm is not None:
                dm.teardown(stage="fit")
            call("teardown", "fit")

        def state_dict(self) -> dict[str, Any]:
            checkpoint: dict[str, Any] = {}
            call("on_save_checkpoint", checkpoint)
            return {
                "module_checkpoint": checkpoint,
                "datamodule": dm.state_dict() if dm is not None else {},
                "global_step": trainer.global_step,
            }

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            trainer.global_step = int(state_dict.get("global_step", 0))
            if dm is not None:
                dm.load_state_dict(state_dict.get("datamodule", {}))
            call("on_load_checkpoint", dict(state_dict.get("module_checkpoint", {})))

    del module
    return _Hooks()
