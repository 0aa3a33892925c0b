"""Recording of everything a trial author can observe during ``Trainer.fit()``.

A :class:`Recorder` collects one flat list of events.  Three kinds of events exist:

* ``hook``: a :class:`PyTorchCallback` method was called by the trainer;
* ``trial``: a trial method (``train_batch``, ``evaluate_batch``, ...) or a piece of user code
  called by the trainer (a ``clip_grads`` function, a ``MetricReducer`` method) ran;
* ``note``: something the trial code itself decided to do (e.g. asking for a stop).

Every argument is converted to plain Python values at the moment of the call, so later mutation
by the trainer (the reference adds ``batches``/``epochs`` to the very dict it passed to
``on_validation_end``) cannot change what was recorded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np
import torch

Event = dict[str, Any]


def normalize(value: Any) -> Any:
    """Convert tensors, numpy values and containers into plain JSON-like Python values."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim else value.item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def list_files(directory: str) -> list[str]:
    """Every file below ``directory``, as sorted paths relative to it."""
    found: list[str] = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            found.append(os.path.relpath(os.path.join(root, name), directory))
    return sorted(found)


class Recorder:
    """Collects the events of one run."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counters: dict[str, int] = {}
        self.checkpoint_dirs: list[str] = []
        self.files_at_write_end: list[list[str]] = []
        self.checkpoint_uuids: list[str] = []

    def log(self, kind: str, name: str, **args: Any) -> None:
        self.events.append({"kind": kind, "name": name, "args": normalize(args)})

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def make_callback(self, pytorch: ModuleType) -> Any:
        """A ``pytorch.PyTorchCallback`` that logs every hook into this recorder."""
        return make_recording_callback(pytorch, self)


def make_recording_callback(pytorch: ModuleType, recorder: Recorder) -> Any:
    """Build a callback subclassing the given API's ``PyTorchCallback`` that records every hook.

    The callback is stateful (it counts the hooks it saw) so that ``state_dict`` /
    ``load_state_dict`` are part of the contract being recorded.
    """

    class RecordingCallback(pytorch.PyTorchCallback):  # type: ignore[name-defined]
        def __init__(self) -> None:
            self.hooks_seen = 0

        def _hook(self, name: str, **args: Any) -> None:
            self.hooks_seen += 1
            recorder.log("hook", name, **args)

        def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
            self._hook(
                "on_trial_startup", first_batch_idx=first_batch_idx, checkpoint_uuid=checkpoint_uuid
            )

        def on_trial_shutdown(self) -> None:
            self._hook("on_trial_shutdown")

        def on_training_start(self) -> None:
            self._hook("on_training_start")

        def on_training_epoch_start(self, epoch_idx: int) -> None:
            self._hook("on_training_epoch_start", epoch_idx=epoch_idx)

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            self._hook("on_training_epoch_end", epoch_idx=epoch_idx)

        def on_training_workload_end(self, avg_metrics: dict[str, Any], batch_metrics: Any) -> None:
            self._hook(
                "on_training_workload_end", avg_metrics=avg_metrics, batch_metrics=batch_metrics
            )

        def on_validation_start(self) -> None:
            self._hook("on_validation_start")

        def on_validation_epoch_start(self) -> None:
            self._hook("on_validation_epoch_start")

        def on_validation_epoch_end(self, outputs: list[Any]) -> None:
            self._hook("on_validation_epoch_end", outputs=outputs)

        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            self._hook("on_validation_end", metrics=metrics)

        def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
            self._hook("on_checkpoint_load_start", keys=sorted(checkpoint))

        def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
            self._hook("on_checkpoint_save_start", keys=sorted(checkpoint))

        def on_checkpoint_end(self, checkpoint_dir: str) -> None:
            self._hook("on_checkpoint_end", path_given=isinstance(checkpoint_dir, str))

        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            self._hook("on_checkpoint_write_end", path_given=isinstance(checkpoint_dir, str))
            recorder.checkpoint_dirs.append(str(checkpoint_dir))
            if isinstance(checkpoint_dir, str) and os.path.isdir(checkpoint_dir):
                recorder.files_at_write_end.append(list_files(checkpoint_dir))
            else:
                recorder.files_at_write_end.append([])

        def on_checkpoint_upload_end(self, uuid: str) -> None:
            self._hook("on_checkpoint_upload_end", uuid_given=isinstance(uuid, str) and bool(uuid))
            recorder.checkpoint_uuids.append(uuid)

        def state_dict(self) -> dict[str, Any]:
            recorder.log("hook", "state_dict")
            return {"hooks_seen": self.hooks_seen}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            recorder.log("hook", "load_state_dict", state_dict=state_dict)
            self.hooks_seen = int(state_dict["hooks_seen"])

    return RecordingCallback()
