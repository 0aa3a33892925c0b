"""Trials and fit() scenarios shared by the reference and the bridge.

Every trial class is built by a factory that receives the API module (``determined.pytorch`` or
``lightning_bridge``), so the very same trial code runs on both.  The data is tiny, generated
in-process from a fixed ``torch.Generator`` and fast on a CPU.

Each trial logs what it receives (batch and epoch indices, the sample ids of every batch, the
model mode, whether autograd is on, the learning rate) into a :class:`Recorder`, interleaved with
the callback hooks, so that the order in which the trainer calls user code is observable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from .recording import Recorder

TrialFactory = Callable[[ModuleType, Recorder], type]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One trial plus the arguments of ``init()`` and ``fit()`` it is run with."""

    name: str
    description: str
    make_trial: TrialFactory
    fit_kwargs: Callable[[ModuleType], dict[str, Any]]
    hparams: dict[str, Any]
    exp_conf: dict[str, Any] | None = None
    init_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 1234


# --------------------------------------------------------------------------------------------
# Data


def regression_dataset(n: int, in_dim: int, seed: int) -> TensorDataset:
    """``(ids, x, y)`` samples of a noisy linear target; ids identify samples in batches."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=gen)
    w = torch.randn(in_dim, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=gen)
    return TensorDataset(torch.arange(n), x, y)


def classification_dataset(n: int, in_dim: int, classes: int, seed: int) -> TensorDataset:
    """``(ids, x, label)`` samples of a linearly separable-ish problem."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=gen)
    w = torch.randn(in_dim, classes, generator=gen)
    labels = (x @ w + 0.5 * torch.randn(n, classes, generator=gen)).argmax(dim=1)
    return TensorDataset(torch.arange(n), x, labels)


class PairBatch:
    """A custom batch type: neither a tensor, a dict, a list nor a tuple.

    The default batch-length logic cannot size it, so a trial using it must override
    ``get_batch_length``.  It can move itself to a device, like many user batch classes.
    """

    def __init__(self, ids: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        self.ids = ids
        self.x = x
        self.y = y

    def to(self, device: Any) -> PairBatch:
        return PairBatch(self.ids.to(device), self.x.to(device), self.y.to(device))


def collate_pairs(samples: list[tuple[torch.Tensor, ...]]) -> PairBatch:
    ids, x, y = default_collate(samples)
    return PairBatch(ids, x, y)


def _param_sum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def _lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


class _NamedModels:
    """Mixin giving the harness access to the trial's models and optimizers."""

    models_by_name: dict[str, nn.Module]
    optimizers_by_name: dict[str, torch.optim.Optimizer]


# --------------------------------------------------------------------------------------------
# 1. One model, SGD with momentum, per-batch LR schedule, shuffled training data, dropout.


def make_sgd_dropout_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class SGDDropoutTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            data = context.get_data_config()
            self.n_train = int(data["n_train"])
            self.n_val = int(data["n_val"])
            self.model = context.wrap_model(
                nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(p=0.25), nn.Linear(16, 1))
            )
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"), momentum=0.9)
            )
            self.sched = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda=lambda s: 0.97**s),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH,
            )
            self.models_by_name = {"model": self.model}
            self.optimizers_by_name = {"opt": self.opt}

        def build_callbacks(self) -> dict[str, Any]:
            return {"recorder": recorder.make_callback(pytorch)}

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(
                regression_dataset(self.n_train, 4, seed=1),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(regression_dataset(self.n_val, 4, seed=2), batch_size=6)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=ids,
                training=self.model.training,
                grad_enabled=torch.is_grad_enabled(),
                param_sum=_param_sum(self.model),
            )
            lr = _lr(self.opt)
            loss = nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss, "lr": lr}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log(
                "trial",
                "evaluate_batch",
                ids=ids,
                training=self.model.training,
                grad_enabled=torch.is_grad_enabled(),
            )
            pred = self.model(x)
            return {
                "val_loss": nn.functional.mse_loss(pred, y),
                "val_mae": (pred - y).abs().mean(),
            }

    return SGDDropoutTrial


def _fit_sgd_dropout(pytorch: ModuleType) -> dict[str, Any]:
    # 44 samples / batch 8 -> 6 batches per epoch; none of the periods divides 6.
    return {
        "max_length": pytorch.Epoch(3),
        "validation_period": pytorch.Batch(4),
        "checkpoint_period": pytorch.Batch(7),
        "reporting_period": pytorch.Batch(5),
    }


# --------------------------------------------------------------------------------------------
# 2. Two models, two optimizers, gradient clipping, aggregation_frequency=2.


def make_two_models_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class TwoModelsTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model_a = context.wrap_model(nn.Linear(3, 1))
            self.model_b = context.wrap_model(
                nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(p=0.1), nn.Linear(8, 1))
            )
            self.opt_a = context.wrap_optimizer(
                torch.optim.SGD(self.model_a.parameters(), lr=context.get_hparam("lr_a"))
            )
            self.opt_b = context.wrap_optimizer(
                torch.optim.Adam(self.model_b.parameters(), lr=context.get_hparam("lr_b"))
            )
            self.sched_a = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt_a, step_size=1, gamma=0.5),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
            )
            self.sched_b = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.ExponentialLR(self.opt_b, gamma=0.9),
                step_mode=pytorch.LRScheduler.StepMode.MANUAL_STEP,
            )
            self.models_by_name = {"model_a": self.model_a, "model_b": self.model_b}
            self.optimizers_by_name = {"opt_a": self.opt_a, "opt_b": self.opt_b}

        def build_callbacks(self) -> dict[str, Any]:
            return {"recorder": recorder.make_callback(pytorch)}

        def build_training_data_loader(self) -> Any:
            # 27 samples / batch 4 -> 7 batches per epoch (an odd epoch length).
            return pytorch.DataLoader(
                regression_dataset(27, 3, seed=3),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
                collate_fn=collate_pairs,
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(
                regression_dataset(10, 3, seed=4), batch_size=4, collate_fn=collate_pairs
            )

        def get_batch_length(self, batch: Any) -> int:
            recorder.count("get_batch_length")
            return len(batch.x)

        def _clip(self, params: Iterable[torch.nn.Parameter]) -> None:
            param_list = list(params)
            norm = torch.nn.utils.clip_grad_norm_(param_list, max_norm=0.5)
            recorder.log(
                "trial",
                "clip_grads",
                batch_idx=self.context.current_train_batch(),
                n_params=len(param_list),
                total_norm=norm,
            )

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=batch.ids,
                batch_type=type(batch).__name__,
                training=[self.model_a.training, self.model_b.training],
                param_sum_a=_param_sum(self.model_a),
                param_sum_b=_param_sum(self.model_b),
            )
            lr_a, lr_b = _lr(self.opt_a), _lr(self.opt_b)
            loss_a = nn.functional.mse_loss(self.model_a(batch.x), batch.y)
            loss_b = nn.functional.mse_loss(self.model_b(batch.x), batch.y)
            self.context.backward(loss_a)
            self.context.backward(loss_b)
            self.context.step_optimizer(self.opt_a, clip_grads=self._clip)
            self.context.step_optimizer(self.opt_b)
            if batch_idx % 4 == 3:
                self.sched_b.step()
                recorder.log("note", "manual_lr_step", batch_idx=batch_idx)
            return {"loss_a": loss_a, "loss_b": loss_b, "lr_a": lr_a, "lr_b": lr_b}

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            recorder.log(
                "trial",
                "evaluate_batch",
                batch_idx=batch_idx,
                ids=batch.ids,
                batch_type=type(batch).__name__,
                training=[self.model_a.training, self.model_b.training],
                grad_enabled=torch.is_grad_enabled(),
            )
            return {
                "val_loss_a": nn.functional.mse_loss(self.model_a(batch.x), batch.y),
                "val_loss_b": nn.functional.mse_loss(self.model_b(batch.x), batch.y),
            }

    return TwoModelsTrial


def _fit_two_models(pytorch: ModuleType) -> dict[str, Any]:
    # 3 epochs of 7 batches = 21 batches: the last batch accumulates without stepping.
    return {
        "max_length": pytorch.Epoch(3),
        "validation_period": pytorch.Epoch(1),
        "checkpoint_period": pytorch.Batch(10),
        "reporting_period": pytorch.Batch(3),
        "checkpoint_policy": "none",
    }


# --------------------------------------------------------------------------------------------
# 3. Custom reducers and per-metric evaluation reducers.


def median_abs_error(values: list[Any]) -> float:
    """Function reducer: the median of every value passed to ``update()``."""
    flat = torch.cat([torch.as_tensor(v).reshape(-1) for v in values])
    return float(flat.median())


def count_updates(values: list[Any]) -> int:
    """Function reducer used for both training and validation: how many updates it saw."""
    return len(values)


def make_reducers_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class ClassAccuracyReducer(pytorch.MetricReducer):  # type: ignore[name-defined]
        """Returns several metrics at once (wrapped with ``name=None``)."""

        def __init__(self) -> None:
            self.reset()

        def reset(self) -> None:
            recorder.log("trial", "reducer_reset")
            self.correct = 0
            self.total = 0
            self.per_class = [0, 0, 0]

        def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
            self.correct += int((pred == target).sum())
            self.total += len(target)
            for c in range(3):
                self.per_class[c] += int((target == c).sum())

        def per_slot_reduce(self) -> Any:
            recorder.log("trial", "reducer_per_slot_reduce", total=self.total)
            return self.correct, self.total, list(self.per_class)

        def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
            recorder.log("trial", "reducer_cross_slot_reduce", n_slots=len(per_slot_metrics))
            correct = sum(m[0] for m in per_slot_metrics)
            total = sum(m[1] for m in per_slot_metrics)
            per_class = [sum(m[2][c] for m in per_slot_metrics) for c in range(3)]
            return {
                "val_custom_acc": correct / total,
                "val_class0_share": per_class[0] / total,
            }

    class ReducersTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(nn.Linear(5, 3))
            self.opt = context.wrap_optimizer(
                torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr"))
            )
            self.sched = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.8),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP,
                frequency=2,
            )
            self.train_median = context.wrap_reducer(
                median_abs_error, name="train_median_margin", for_validation=False
            )
            self.accuracy = context.wrap_reducer(ClassAccuracyReducer(), for_training=False)
            self.updates = context.wrap_reducer(count_updates, name="updates")
            self.models_by_name = {"model": self.model}
            self.optimizers_by_name = {"opt": self.opt}

        def build_callbacks(self) -> dict[str, Any]:
            return {"recorder": recorder.make_callback(pytorch)}

        def build_training_data_loader(self) -> Any:
            # 30 samples / batch 8 -> 4 batches per epoch, the last one of 6 samples.
            return pytorch.DataLoader(
                classification_dataset(30, 5, 3, seed=5),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
            )

        def build_validation_data_loader(self) -> Any:
            # 17 samples / batch 5 -> batches of 5, 5, 5, 2.
            return pytorch.DataLoader(classification_dataset(17, 5, 3, seed=6), batch_size=5)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            ids, x, labels = batch
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=ids,
                lr=_lr(self.opt),
                is_epoch_start=self.context.is_epoch_start(),
                is_epoch_end=self.context.is_epoch_end(),
                current_train_epoch=self.context.current_train_epoch(),
                current_train_batch=self.context.current_train_batch(),
            )
            logits = self.model(x)
            loss = nn.functional.cross_entropy(logits, labels)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            margin = logits.detach().max(dim=1).values - logits.detach().min(dim=1).values
            self.train_median.update(margin)
            self.updates.update(batch_idx)
            # A non-scalar metric: the per-class mean logit.
            return {"loss": loss, "mean_logits": logits.detach().mean(dim=0)}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            ids, x, labels = batch
            recorder.log("trial", "evaluate_batch", ids=ids, training=self.model.training)
            logits = self.model(x)
            probs = logits.softmax(dim=1)
            pred = logits.argmax(dim=1)
            self.accuracy.update(pred, labels)
            self.updates.update(len(labels))
            return {
                "v_avg": nn.functional.cross_entropy(logits, labels),
                "v_sum": (pred == labels).sum(),
                "v_max": probs.max(),
                "v_min": probs.min(),
                "v_vec": logits.mean(dim=0),
            }

        def evaluation_reducer(self) -> dict[str, Any]:
            return {
                "v_avg": pytorch.Reducer.AVG,
                "v_sum": pytorch.Reducer.SUM,
                "v_max": pytorch.Reducer.MAX,
                "v_min": pytorch.Reducer.MIN,
                "v_vec": pytorch.Reducer.AVG,
            }

    return ReducersTrial


def _fit_reducers(pytorch: ModuleType) -> dict[str, Any]:
    return {
        "max_length": pytorch.Batch(14),
        "validation_period": pytorch.Batch(6),
        "reporting_period": pytorch.Batch(4),
    }


# --------------------------------------------------------------------------------------------
# 4. evaluate_full_dataset with Batch schedules and step-zero validation.


def make_full_dataset_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class FullDatasetTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(
                nn.Sequential(nn.Linear(2, 6), nn.ReLU(), nn.Dropout(p=0.3), nn.Linear(6, 1))
            )
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(
                    self.model.parameters(),
                    lr=context.get_hparam("lr"),
                    momentum=0.5,
                    weight_decay=1e-3,
                )
            )
            self.models_by_name = {"model": self.model}
            self.optimizers_by_name = {"opt": self.opt}

        def build_callbacks(self) -> dict[str, Any]:
            return {"recorder": recorder.make_callback(pytorch)}

        def build_training_data_loader(self) -> Any:
            # 40 samples / batch 5 -> 8 batches per epoch; a user generator drives shuffling.
            return pytorch.DataLoader(
                regression_dataset(40, 2, seed=7),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
                generator=torch.Generator().manual_seed(99),
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(regression_dataset(12, 2, seed=8), batch_size=5)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=ids,
                training=self.model.training,
            )
            loss = nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
            seen: list[int] = []
            total = 0.0
            count = 0
            for ids, x, y in data_loader:
                seen.extend(int(i) for i in ids)
                total += float(((self.model(x) - y) ** 2).sum())
                count += len(y)
            recorder.log(
                "trial",
                "evaluate_full_dataset",
                ids=seen,
                training=self.model.training,
                grad_enabled=torch.is_grad_enabled(),
            )
            return {"val_mse": total / count, "val_count": count}

    return FullDatasetTrial


def _fit_full_dataset(pytorch: ModuleType) -> dict[str, Any]:
    return {
        "max_length": pytorch.Batch(12),
        "validation_period": pytorch.Batch([3, 7, 11]),
        "checkpoint_period": pytorch.Batch([5, 10]),
        "reporting_period": pytorch.Epoch(1),
        "step_zero_validation": True,
    }


# --------------------------------------------------------------------------------------------
# 5. test_mode=True (reuses trial 1).


def _fit_test_mode(pytorch: ModuleType) -> dict[str, Any]:
    return {
        "max_length": pytorch.Epoch(2),
        "validation_period": pytorch.Batch(3),
        "test_mode": True,
    }


# --------------------------------------------------------------------------------------------
# 6. A callback asks for a stop.


def make_stop_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class StopAtEpochEnd(pytorch.PyTorchCallback):  # type: ignore[name-defined]
        def __init__(self, context: Any, epoch: int) -> None:
            self.context = context
            self.epoch = epoch

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            if epoch_idx == self.epoch:
                recorder.log("note", "stop_requested", epoch_idx=epoch_idx)
                self.context.set_stop_requested(True)

    class StopTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(
                nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Dropout(p=0.2), nn.Linear(5, 1))
            )
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
            )
            self.sched = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.9),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH,
                frequency=3,
            )
            self.models_by_name = {"model": self.model}
            self.optimizers_by_name = {"opt": self.opt}

        def build_callbacks(self) -> dict[str, Any]:
            return {
                "recorder": recorder.make_callback(pytorch),
                "stopper": StopAtEpochEnd(self.context, epoch=1),
            }

        def build_training_data_loader(self) -> Any:
            # 27 samples / batch 5 with drop_last -> 5 batches per epoch.
            return pytorch.DataLoader(
                regression_dataset(27, 3, seed=9),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
                drop_last=True,
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(regression_dataset(9, 3, seed=10), batch_size=4)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=ids,
                lr=_lr(self.opt),
                stop_requested=self.context.get_stop_requested(),
            )
            loss = nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log("trial", "evaluate_batch", batch_idx=batch_idx, ids=ids)
            return {"val_loss": nn.functional.mse_loss(self.model(x), y)}

    return StopTrial


def _fit_stop(pytorch: ModuleType) -> dict[str, Any]:
    # The stop is asked for at the end of epoch 1 (after batch 10); the next workload ends at
    # batch 12, where a validation is also due.
    return {
        "max_length": pytorch.Epoch(10),
        "validation_period": pytorch.Batch(6),
        "reporting_period": pytorch.Batch(4),
        "checkpoint_policy": "none",
    }


# --------------------------------------------------------------------------------------------
# 7. aggregation_frequency=3 with three chained schedulers on one optimizer.


def make_aggregation_trial(pytorch: ModuleType, recorder: Recorder) -> type:
    class AggregationTrial(pytorch.PyTorchTrial, _NamedModels):  # type: ignore[name-defined]
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(
                nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Dropout(p=0.2), nn.Linear(6, 1))
            )
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(
                    self.model.parameters(),
                    lr=context.get_hparam("lr"),
                    momentum=0.9,
                    nesterov=True,
                )
            )
            step_mode = pytorch.LRScheduler.StepMode
            # Three chainable schedulers on one optimizer: every step of each one is visible in
            # the learning rate (0.9 ** a * 0.8 ** b * 0.95 ** c).
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.ExponentialLR(self.opt, gamma=0.9),
                step_mode=step_mode.STEP_EVERY_OPTIMIZER_STEP,
                frequency=2,
            )
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.MultiplicativeLR(self.opt, lr_lambda=lambda e: 0.8),
                step_mode=step_mode.STEP_EVERY_EPOCH,
            )
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.95),
                step_mode=step_mode.STEP_EVERY_BATCH,
                frequency=2,
            )
            self.models_by_name = {"model": self.model}
            self.optimizers_by_name = {"opt": self.opt}

        def build_callbacks(self) -> dict[str, Any]:
            return {"recorder": recorder.make_callback(pytorch)}

        def build_training_data_loader(self) -> Any:
            # 35 samples / batch 5 -> 7 batches per epoch.
            return pytorch.DataLoader(
                regression_dataset(35, 4, seed=11),
                batch_size=self.context.get_per_slot_batch_size(),
                shuffle=True,
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(regression_dataset(8, 4, seed=12), batch_size=3)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            ids, x, y = batch
            recorder.log(
                "trial",
                "train_batch",
                batch_idx=batch_idx,
                epoch_idx=epoch_idx,
                ids=ids,
                lr=_lr(self.opt),
                param_sum=_param_sum(self.model),
            )
            loss = nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            # A bare tensor: the trainer reports it as "loss".
            return loss

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            ids, x, y = batch
            recorder.log("trial", "evaluate_batch", ids=ids)
            return {"val_loss": nn.functional.mse_loss(self.model(x), y)}

    return AggregationTrial


def _fit_aggregation(pytorch: ModuleType) -> dict[str, Any]:
    # 20 batches: the last optimizer step is after batch 18; batches 19 and 20 only accumulate.
    return {
        "max_length": pytorch.Batch(20),
        "validation_period": pytorch.Epoch(1),
        "checkpoint_period": pytorch.Batch(9),
        "reporting_period": pytorch.Batch(5),
    }


# --------------------------------------------------------------------------------------------

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            name="sgd_dropout",
            description="SGD+momentum, per-batch LR schedule, shuffle, dropout, "
            "Batch periods that cut across epochs, max_length in epochs",
            make_trial=make_sgd_dropout_trial,
            fit_kwargs=_fit_sgd_dropout,
            hparams={"global_batch_size": 8, "lr": 0.05},
            exp_conf={"data": {"n_train": 44, "n_val": 20}},
        ),
        Scenario(
            name="two_models",
            description="two models/optimizers, clip_grads, aggregation_frequency=2, "
            "STEP_EVERY_EPOCH and MANUAL_STEP schedulers, custom batch type",
            make_trial=make_two_models_trial,
            fit_kwargs=_fit_two_models,
            hparams={"global_batch_size": 4, "lr_a": 0.2, "lr_b": 0.02},
            init_kwargs={"aggregation_frequency": 2, "enable_tensorboard_logging": False},
        ),
        Scenario(
            name="reducers",
            description="function and MetricReducer reducers, per-metric evaluation reducers, "
            "non-scalar metrics, STEP_EVERY_OPTIMIZER_STEP frequency=2",
            make_trial=make_reducers_trial,
            fit_kwargs=_fit_reducers,
            hparams={"global_batch_size": 8, "lr": 0.05},
            init_kwargs={"enable_tensorboard_logging": False},
        ),
        Scenario(
            name="full_dataset",
            description="evaluate_full_dataset, Batch schedules, step_zero_validation, "
            "reporting every epoch",
            make_trial=make_full_dataset_trial,
            fit_kwargs=_fit_full_dataset,
            hparams={"global_batch_size": 5, "lr": 0.05},
            init_kwargs={"enable_tensorboard_logging": False},
        ),
        Scenario(
            name="test_mode",
            description="test_mode=True: one training batch, one validation batch",
            make_trial=make_sgd_dropout_trial,
            fit_kwargs=_fit_test_mode,
            hparams={"global_batch_size": 8, "lr": 0.05},
            exp_conf={"data": {"n_train": 44, "n_val": 20}},
            init_kwargs={"enable_tensorboard_logging": False},
        ),
        Scenario(
            name="stop_requested",
            description="a callback calls set_stop_requested(True) at the end of epoch 1",
            make_trial=make_stop_trial,
            fit_kwargs=_fit_stop,
            hparams={"global_batch_size": 5, "lr": 0.05},
            init_kwargs={"enable_tensorboard_logging": False},
        ),
        Scenario(
            name="aggregation3",
            description="aggregation_frequency=3, chained STEP_EVERY_OPTIMIZER_STEP/EPOCH/BATCH "
            "schedulers, train_batch returning a bare tensor",
            make_trial=make_aggregation_trial,
            fit_kwargs=_fit_aggregation,
            hparams={"global_batch_size": 5, "lr": 0.05},
            init_kwargs={"aggregation_frequency": 3, "enable_tensorboard_logging": False},
        ),
    ]
}
