"""Bad input stops early with one clear message that names the fix."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from tests._trials import LinearTrial, RegressionData, fit, quiet_init


def _no_lightning_frames(exc: BaseException) -> None:
    frames = traceback.extract_tb(exc.__traceback__)
    assert not [f for f in frames if "/lightning/" in f.filename], "traceback shows Lightning"


def _fit_error(trial_cls: type = LinearTrial, **fit_kwargs: Any) -> pytorch.BridgeError:
    fit_kwargs.setdefault("max_length", pytorch.Batch(4))
    with pytest.raises(pytorch.BridgeError) as info:
        fit(trial_cls, **fit_kwargs)
    _no_lightning_frames(info.value)
    return info.value


def test_missing_max_length() -> None:
    err = _fit_error(max_length=None)
    assert "max_length" in str(err) and "Epoch(1)" in str(err)


@pytest.mark.parametrize("bad", [pytorch.Epoch(1.5), pytorch.Batch([1, 2]), 10])
def test_non_int_max_length(bad: Any) -> None:
    err = _fit_error(max_length=bad)
    assert "Batch(int) or an Epoch(int)" in str(err)


def test_unknown_checkpoint_policy() -> None:
    err = _fit_error(checkpoint_policy="sometimes")
    assert "best, all, none" in str(err) and "'sometimes'" in str(err)


def test_bad_period_type() -> None:
    err = _fit_error(validation_period=5)
    assert "validation_period must be a Batch or Epoch" in str(err)


class BothEvaluate(LinearTrial):
    def evaluate_full_dataset(self, data_loader: Any) -> dict[str, Any]:
        return {}


class NoEvaluate(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(8), batch_size=4)

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(8), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        return {}


@pytest.mark.parametrize(("cls", "word"), [(BothEvaluate, "both"), (NoEvaluate, "neither")])
def test_exactly_one_evaluate(cls: type, word: str) -> None:
    err = _fit_error(cls)
    assert "exactly one of evaluate_batch() or evaluate_full_dataset()" in str(err)
    assert word in str(err)


class ForeignOptimizer(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
        return loss


def test_unwrapped_optimizer() -> None:
    err = _fit_error(ForeignOptimizer)
    assert "not returned by context.wrap_optimizer()" in str(err)


class ListMetrics(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        super().train_batch(batch, epoch_idx, batch_idx)
        return [1.0]


class TensorValidation(LinearTrial):
    def evaluate_batch(self, batch: Any, batch_idx: int) -> Any:
        return torch.tensor(1.0)


def test_non_dict_training_metrics() -> None:
    err = _fit_error(ListMetrics)
    assert "train_batch() must return the loss tensor or a dict" in str(err)
    assert "list" in str(err)


def test_non_dict_validation_metrics() -> None:
    err = _fit_error(TensorValidation)
    assert "evaluate_batch() must return a dict" in str(err)


class ChangingKeys(LinearTrial):
    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        out = super().evaluate_batch(batch, batch_idx)
        if batch_idx == 1:
            out["extra"] = 1.0
        return out


def test_differing_validation_keys() -> None:
    err = _fit_error(ChangingKeys)
    assert "same metric names for every batch" in str(err) and "extra" in str(err)


class EmptyValidation(LinearTrial):
    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(0), batch_size=4)


def test_empty_validation_loader() -> None:
    err = _fit_error(EmptyValidation)
    assert "validation data loader yields no batches" in str(err)


def test_missing_hparam_lists_existing() -> None:
    with quiet_init(hparams={"global_batch_size": 8, "lr": 0.1}) as ctx:
        with pytest.raises(pytorch.InvalidArgumentError) as info:
            ctx.get_hparam("momentum")
    assert "'momentum'" in str(info.value)
    assert "['global_batch_size', 'lr']" in str(info.value)


def test_global_batch_size_not_divisible() -> None:
    dist = pytorch.DistributedContext(rank=0, size=3, local_rank=0, local_size=3)
    with pytest.raises(pytorch.InvalidArgumentError) as info:
        with quiet_init(hparams={"global_batch_size": 32}, distributed=dist):
            pass
    assert "does not divide evenly across 3 processes" in str(info.value)
    assert "e.g. 30" in str(info.value)


class BackwardInInit(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        context.backward(self.model(torch.ones(1, 4)).sum())


def test_backward_outside_train_batch() -> None:
    with quiet_init() as ctx:
        with pytest.raises(pytorch.InvalidTrialError) as info:
            BackwardInInit(ctx)
    assert "outside train_batch()" in str(info.value)


def test_step_mode_must_be_step_mode() -> None:
    with quiet_init() as ctx:
        trial = LinearTrial(ctx)
        sched = torch.optim.lr_scheduler.StepLR(trial.opt, step_size=1)
        with pytest.raises(pytorch.InvalidTrialError) as info:
            ctx.wrap_lr_scheduler(sched, step_mode="every batch")  # type: ignore[arg-type]
    assert "LRScheduler.StepMode" in str(info.value)


def test_no_model_wrapped() -> None:
    class NoModel(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context

    err = _fit_error(NoModel)
    assert "wrap_model" in str(err)


def test_plain_torch_dataloader_needs_opt_out() -> None:
    class PlainLoader(LinearTrial):
        def build_training_data_loader(self) -> Any:
            return torch.utils.data.DataLoader(RegressionData(8), batch_size=4)

    err = _fit_error(PlainLoader)
    assert "disable_dataset_reproducibility_checks" in str(err)


def test_trainer_option_of_lightning_trainer_loop_refused() -> None:
    err = _fit_error(init_kwargs={"trainer_kwargs": {"max_epochs": 3}})
    assert "'max_epochs'" in str(err) and "TrialModule" in str(err)


def test_spawning_strategy_refused() -> None:
    init = {"strategy": "ddp_spawn", "devices": 2, "accelerator": "cpu"}
    err = _fit_error(init_kwargs=init)
    assert "'spawn'" in str(err) and "strategy='ddp'" in str(err) and "torchrun" in str(err)
