"""The `PyTorchCallback` through which the trainer's moments reach a `LightningRun`.

Built on the callback class of the API the trial runs on (`lightning_bridge` or
`determined.pytorch`), since each trainer checks for its own class. Each trainer moment is one
call of the run, which runs the module's (and its Lightning callbacks') hooks in Lightning's
order; the callback's state is the run's (what the module and callbacks save with a checkpoint).
"""

from __future__ import annotations

import types
from typing import Any

from lightning_bridge.adapter._run import LightningRun


def trial_callback(api: types.ModuleType, run: LightningRun) -> Any:
    """A `PyTorchCallback` of `api` that hands each moment of the trainer to `run`."""

    class LightningHooks(api.PyTorchCallback):  # type: ignore[name-defined]
        def on_training_start(self) -> None:
            run.start_training()

        def on_training_epoch_start(self, epoch_idx: int) -> None:
            run.start_epoch(epoch_idx)

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            run.end_epoch()

        def on_validation_start(self) -> None:
            run.start_validation()

        def on_validation_epoch_end(self, outputs: list) -> None:
            run.end_validation_epoch()

        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            run.end_validation()

        def on_trial_shutdown(self) -> None:
            run.end_training()

        def state_dict(self) -> dict[str, Any]:
            return run.state_dict()

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            run.load_state_dict(state_dict)

    return LightningHooks()
