"""Trials for the checkpoint interop tests, defined at module level.

A checkpoint's ``load_data.json`` names its trial class as ``module:QualName`` and
``load_trial_from_checkpoint_path`` imports it from there, so the classes below live at the top
level of an importable module: :class:`BridgeRegressionTrial` (a ``lightning_bridge`` trial) and,
when ``determined`` is installed, :class:`ReferenceRegressionTrial` (a ``determined.pytorch``
trial). Both share one body, so the same code trains on either side.

The trial has dropout, SGD with momentum and a learning rate that decays after every batch, so a
continuation is only exact when the weights, the optimizer's momentum, the scheduler, the RNG and
the data position are all restored.  It records what it observes into a :class:`CkptRecorder`
(the interop suite's :class:`Recorder` plus the model and optimizer state seen at
``on_training_start``), and it can ask for a stop after a given number of batches.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

import lightning_bridge

from .recording import Recorder
from .trials import regression_dataset

try:
    from determined import pytorch as det_pytorch
except ImportError:  # the bridge-only parts of this module stay usable
    det_pytorch = None

IN_DIM = 4
BATCH_SIZE = 8
LR_DECAY = 0.97


class CkptRecorder(Recorder):
    """A :class:`Recorder` that also keeps, per ``on_training_start``, the state a run began
    from: every model's weights and every optimizer's state tensors (as numpy arrays), the
    learning rates, and (from the last one) torch's and numpy's global RNG states."""

    def __init__(self) -> None:
        super().__init__()
        self.start_weights: list[list[dict[str, np.ndarray]]] = []
        self.start_optimizer_tensors: list[list[dict[str, np.ndarray]]] = []
        self.start_lrs: list[list[float]] = []
        self.start_rng: dict[str, Any] = {}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """The optimizer's per-parameter state tensors (momentum buffers, Adam moments), keyed by
    ``"<param index>.<name>"``."""
    out: dict[str, np.ndarray] = {}
    for idx, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{idx}.{name}"] = value.detach().cpu().numpy().copy()
    return out


def model_weights(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _make_callbacks(pytorch: ModuleType, trial: Any, recorder: CkptRecorder) -> dict[str, Any]:
    class StartProbe(pytorch.PyTorchCallback):  # type: ignore[name-defined]
        """Captures what the run starts from, after any checkpoint was restored."""

        def on_training_start(self) -> None:
            ctx = trial.context
            recorder.start_weights.append([model_weights(m) for m in ctx.models])
            recorder.start_optimizer_tensors.append([optimizer_tensors(o) for o in ctx.optimizers])
            recorder.start_lrs.append([float(g["lr"]) for g in trial.opt.param_groups])
            recorder.start_rng = {
                "torch": torch.random.get_rng_state(),
                "numpy": np.random.get_state(),
            }

    return {"recorder": recorder.make_callback(pytorch), "probe": StartProbe()}


class _RegressionBody:
    """The trial code both sides run.

    Data config (``exp_conf["data"]``): ``n_train``, ``n_val`` and ``shuffle``.  ``stop_after``
    asks for a stop (``context.set_stop_requested(True)``) while training that batch number.
    """

    api: ClassVar[ModuleType]

    def __init__(
        self,
        context: Any,
        recorder: CkptRecorder | None = None,
        stop_after: int | None = None,
    ) -> None:
        self.context = context
        self.recorder = recorder if recorder is not None else CkptRecorder()
        self.stop_after = stop_after
        data = context.get_data_config()
        self.n_train = int(data.get("n_train", 44))
        self.n_val = int(data.get("n_val", 20))
        self.shuffle = bool(data.get("shuffle", False))
        self.model = context.wrap_model(
            nn.Sequential(nn.Linear(IN_DIM, 16), nn.ReLU(), nn.Dropout(p=0.25), nn.Linear(16, 1))
        )
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"), momentum=0.9)
        )
        self.sched = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda=lambda s: LR_DECAY**s),
            step_mode=self.api.LRScheduler.StepMode.STEP_EVERY_BATCH,
        )

    def build_callbacks(self) -> dict[str, Any]:
        return _make_callbacks(self.api, self, self.recorder)

    def build_training_data_loader(self) -> Any:
        return self.api.DataLoader(
            regression_dataset(self.n_train, IN_DIM, seed=21),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=self.shuffle,
        )

    def build_validation_data_loader(self) -> Any:
        return self.api.DataLoader(regression_dataset(self.n_val, IN_DIM, seed=22), batch_size=6)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        ids, x, y = batch
        lr = float(self.opt.param_groups[0]["lr"])
        self.recorder.log(
            "trial", "train_batch", batch_idx=batch_idx, epoch_idx=epoch_idx, ids=ids, lr=lr
        )
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if self.stop_after is not None and batch_idx + 1 == self.stop_after:
            self.recorder.log("note", "stop_requested", batch_idx=batch_idx)
            self.context.set_stop_requested(True)
        return {"loss": loss, "lr": lr}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        ids, x, y = batch
        self.recorder.log("trial", "evaluate_batch", ids=ids)
        pred = self.model(x)
        return {"val_loss": nn.functional.mse_loss(pred, y)}


class BridgeRegressionTrial(_RegressionBody, lightning_bridge.PyTorchTrial):
    api = lightning_bridge


if det_pytorch is not None:

    class ReferenceRegressionTrial(_RegressionBody, det_pytorch.PyTorchTrial):
        api = det_pytorch

else:  # pragma: no cover - only without determined installed
    ReferenceRegressionTrial = None  # type: ignore[assignment,misc]


def trial_class_for(pytorch: ModuleType) -> type:
    """The trial class written against the API module ``pytorch``."""
    if pytorch is lightning_bridge:
        return BridgeRegressionTrial
    if det_pytorch is not None and pytorch is det_pytorch:
        return ReferenceRegressionTrial
    raise ValueError(f"no trial class for {pytorch.__name__}")
