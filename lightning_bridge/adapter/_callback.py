"""The reducers and the `PyTorchCallback` through which a ported module meets the trainer.

Both are built on the classes of the API the trial runs on (`lightning_bridge` or
`determined.pytorch`), since each trainer checks for its own classes. The callback runs the
module's (and its Lightning callbacks') fit, epoch, validation and checkpoint hooks at the
trainer's moments, in Lightning's order: when validation falls at the end of a training epoch,
the epoch's end (`on_train_epoch_end`, its epoch-level values, plateau schedulers) waits until
that validation is over, as in `lightning.Trainer`.
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
    hook, call, log, trainer = adapter._hook, adapter._call, adapter._log, adapter._trainer
    dm = adapter.datamodule

    class _Hooks(api.PyTorchCallback):
        def on_training_start(self) -> None:
            hook("on_fit_start")
            hook("on_train_start")

        def on_training_epoch_start(self, epoch_idx: int) -> None:
            adapter._flush()
            trainer.current_epoch = epoch_idx
            trainer.state.stage = RunningStage.TRAINING
            hook("on_train_epoch_start")

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            if adapter._has_validation:
                # Lightning validates first when validation falls at the epoch's end.
                adapter._pending.append("epoch_end")
                log.epoch_pending = True
            else:
                adapter._flush()
                adapter._end_epoch()

        def on_validation_start(self) -> None:
            adapter._validation_start()

        def on_validation_epoch_end(self, outputs: list) -> None:
            adapter._validation_epoch_end()

        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            adapter._validation_end()

        def on_trial_shutdown(self) -> None:
            adapter._flush()
            hook("on_train_end")
            hook("on_fit_end")
            if dm is not None:
                dm.teardown(stage="fit")
            adapter._callbacks.call("teardown", "fit")
            call("teardown", "fit")

        def state_dict(self) -> dict[str, Any]:
            adapter._flush()
            checkpoint: dict[str, Any] = {}
            callbacks = adapter._callbacks.state_dict()
            adapter._callbacks.call("on_save_checkpoint", checkpoint)
            call("on_save_checkpoint", checkpoint)
            return {
                "module_checkpoint": checkpoint,
                "datamodule": dm.state_dict() if dm is not None else {},
                "callbacks": callbacks,
                "global_step": trainer.global_step,
                "current_epoch": trainer.current_epoch,
            }

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            trainer.global_step = int(state_dict.get("global_step", 0))
            trainer.current_epoch = int(state_dict.get("current_epoch", 0))
            checkpoint = dict(state_dict.get("module_checkpoint", {}))
            call("on_load_checkpoint", checkpoint)
            if dm is not None:
                dm.load_state_dict(state_dict.get("datamodule", {}))
            adapter._callbacks.load_state_dict(dict(state_dict.get("callbacks", {})))
            adapter._callbacks.call("on_load_checkpoint", checkpoint)

    return _Hooks()
