"""LightningAdapter: hook order, overridable steps, the stand-in trainer, refusals, resuming."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import lightning_bridge as bridge
from tests._adapter_modules import (
    BRIDGE_INIT,
    ManualNet,
    Net,
    make_data,
    run_lightning,
    run_trial,
    weights,
)

HPARAMS = {"global_batch_size": 8, "lr": 0.1}
HOOKS = [
    "on_fit_start",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_before_zero_grad",
    "optimizer_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "lr_scheduler_step",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_validation_model_eval",
    "on_validation_start",
    "on_validation_epoch_start",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_validation_epoch_end",
    "on_validation_end",
    "on_validation_model_train",
    "on_train_end",
    "on_fit_end",
    "teardown",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
]


class Recording(Net):
    """Net that records its hook calls and what it reads from `self.trainer`."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8) -> None:
        super().__init__(lr=lr, batch_size=batch_size)
        self.calls: list[str] = []
        self.seen: list[tuple[int, int, bool]] = []
        for name in HOOKS:
            self._record(name)

    def _record(self, name: str) -> None:
        original = getattr(self, name)

        def hook(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return original(*args, **kwargs)

        object.__setattr__(self, name, hook)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append("training_step")
        self.seen.append((self.current_epoch, self.global_step, self.trainer.training))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("validation_step")
        assert self.trainer.validating and not self.training
        super().validation_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(make_data(16, 1), batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(make_data(8, 2), batch_size=8)


def test_hooks_run_in_lightnings_order() -> None:
    expected = Recording()
    run_lightning(expected, epochs=1, gradient_clip_val=0.5)
    trial, _, _ = run_trial(
        bridge,
        bridge.lightning_trial(Recording),
        {**HPARAMS, "gradient_clip_val": 0.5},
        epochs=1,
        **BRIDGE_INIT,
    )
    got = trial.lightning_module
    # Validation at the epoch's end runs before on_train_epoch_end, as in Lightning.
    assert got.calls == expected.calls
    assert got.calls.index("on_validation_end") < got.calls.index("on_train_epoch_end")
    assert got.seen == expected.seen == [(0, 0, True), (0, 1, True)]
    assert torch.allclose(got.body.weight, expected.body.weight)


class Overrides(Net):
    """Overrides optimizer_step, optimizer_zero_grad, backward and the transfer hooks."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8) -> None:
        super().__init__(lr=lr, batch_size=batch_size)
        self.steps = 0

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, closure: Any) -> None:
        self.steps += 1
        if batch_idx % 2 == 0:
            optimizer.step(closure=closure)  # odd batches only run the closure
        else:
            closure()

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        if batch_idx % 2 == 0:
            optimizer.zero_grad()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        (loss * 2).backward()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return x * 0.5, y


def test_overridden_steps_and_transfer_hooks_match_lightning() -> None:
    expected = Overrides()
    run_lightning(expected, epochs=2, gradient_clip_val=0.3, gradient_clip_algorithm="value")
    hparams = {**HPARAMS, "gradient_clip_val": 0.3, "gradient_clip_algorithm": "value"}
    trial, _, val = run_trial(bridge, bridge.lightning_trial(Overrides), hparams, **BRIDGE_INIT)
    got = trial.lightning_module
    assert got.steps == expected.steps == 16
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(weights(got).values(), weights(expected).values(), strict=True)
    )
    assert diff < 1e-6


class Stopping(Net):
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == 3:
            self.trainer.should_stop = True


def test_should_stop_ends_training_at_the_next_boundary() -> None:
    # Two epochs of 8 batches were asked for; the stop request (batch 4) takes effect at the
    # end of the reporting period (the epoch), as set_stop_requested does in Determined.
    trial, train, _ = run_trial(bridge, bridge.lightning_trial(Stopping), HPARAMS, **BRIDGE_INIT)
    assert trial.lightning_module.trainer.global_step == 8
    assert len(train) == 1


class ReadsTrainer(Net):
    def on_fit_start(self) -> None:
        t = self.trainer
        self.info = (
            t.is_global_zero,
            t.world_size,
            t.global_rank,
            t.logger,
            t.num_training_batches,
        )
        t.estimated_stepping_batches  # noqa: B018 - a Lightning-only attribute


def test_stand_in_trainer_answers_and_names_what_it_lacks() -> None:
    # Without an experiment config the trial's length is unknown when the module asks.
    with pytest.raises(
        bridge.InvalidTrialError,
        match=r"self\.trainer\.estimated_stepping_batches`, but the trial's length is not known",
    ):
        run_trial(bridge, bridge.lightning_trial(ReadsTrainer), HPARAMS, **BRIDGE_INIT)


class LBFGSNet(Net):
    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters())


class TwoOptimizersAutomatic(Net):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.body.parameters()), torch.optim.SGD(self.head.parameters())]


class IterStep(Net):
    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        return None


class NeedsArg(Net):
    def __init__(self, depth: int, lr: float = 0.1) -> None:
        super().__init__(lr=lr)


class Pruned(Net):
    def configure_callbacks(self) -> Any:
        from lightning.pytorch.callbacks import BackboneFinetuning

        return [BackboneFinetuning(unfreeze_backbone_at_epoch=1)]


class BatchNormSWA(Net):
    def __init__(self, lr: float = 0.1, batch_size: int = 8) -> None:
        super().__init__(lr=lr, batch_size=batch_size)
        self.norm = torch.nn.BatchNorm1d(6)

    def configure_callbacks(self) -> Any:
        from lightning.pytorch.callbacks import StochasticWeightAveraging

        return StochasticWeightAveraging(swa_lrs=0.01)


class Checkpointing(Net):
    def configure_callbacks(self) -> Any:
        from lightning.pytorch.callbacks import ModelCheckpoint

        return [ModelCheckpoint(monitor="val_acc", mode="max")]


class TrainLoaders(Net):
    def train_dataloader(self) -> Any:
        return [DataLoader(make_data(8, 2)), DataLoader(make_data(8, 3))]


SEARCHER = {"searcher": {"metric": "val_loss", "smaller_is_better": True}}


@pytest.mark.parametrize(
    ("module_cls", "hparams", "conf", "match"),
    [
        (LBFGSNet, {}, None, "LBFGS"),
        (TwoOptimizersAutomatic, {}, None, "multiple optimizers is only supported with manual"),
        (IterStep, {}, None, r"training_step\(dataloader_iter\)"),
        (NeedsArg, {}, None, "needs 'depth'"),
        (NeedsArg, {"depth": None}, None, r"takes 'depth' without a default.*give null"),
        (Pruned, {}, None, r"BackboneFinetuning is not supported by LightningAdapter: it adds"),
        (BatchNormSWA, {}, None, r"StochasticWeightAveraging on a module with BatchNorm"),
        (Checkpointing, {}, SEARCHER,
         r"ModelCheckpoint\(monitor='val_acc', mode='max'\).*set searcher\.metric: val_acc"),
        (Net, {"max_epochs": 3}, None,
         r"hparams\['max_epochs'\] is a lightning\.Trainer argument.*searcher\.max_length"),
        (Net, {"val_check_interval": 3}, None, r"min_validation_period"),
        (Net, {"precision": "8-bit"}, None, r"hparams\['precision'\] is '8-bit'"),
        (ManualNet, {"accumulate_grad_batches": 2}, None,
         r"Automatic gradient accumulation is not supported for manual optimization"),
        (ManualNet, {"gradient_clip_val": 0.5}, None,
         r"Automatic gradient clipping is not supported for manual optimization"),
    ],
)  # fmt: skip
def test_unsupported_modules_fail_at_construction(
    module_cls: type, hparams: dict[str, Any], conf: dict[str, Any] | None, match: str
) -> None:
    exp_conf = None if conf is None else {**conf, "hyperparameters": HPARAMS}
    with bridge.init(hparams={**HPARAMS, **hparams}, exp_conf=exp_conf, **BRIDGE_INIT) as ctx:
        with pytest.raises(bridge.InvalidTrialError, match=match):
            bridge.lightning_trial(module_cls)(ctx)


def test_aggregation_frequency_must_divide_the_epoch() -> None:
    # Net's epoch is 8 batches: an aggregation of 3 cannot step where Lightning steps.
    with bridge.init(hparams=HPARAMS, aggregation_frequency=3, **BRIDGE_INIT) as ctx:
        trial = bridge.lightning_trial(Net)(ctx)
        assert trial.lightning_module.trainer.accumulate_grad_batches == 3
        with pytest.raises(bridge.InvalidTrialError, match="aggregation_frequency is 3 but an"):
            trial.build_training_data_loader()


def test_several_training_loaders_are_refused() -> None:
    with pytest.raises(bridge.InvalidTrialError, match=r"train_dataloader\(\) returned 2 data"):
        run_trial(bridge, bridge.lightning_trial(TrainLoaders), HPARAMS, **BRIDGE_INIT)


def test_lightning_trial_checks_its_arguments() -> None:
    with pytest.raises(bridge.InvalidTrialError, match="LightningModule class"):
        bridge.lightning_trial(torch.nn.Linear)
    with pytest.raises(bridge.InvalidTrialError, match="base"):
        bridge.lightning_trial(Net, base=object)
    with pytest.raises(bridge.InvalidTrialError, match="callbacks"):
        bridge.lightning_trial(Net, callbacks="EarlyStopping")  # type: ignore[arg-type]


class Stateful(Net):
    """No shuffling (the resumed run must see the same batches) and checkpoint hooks."""

    def __init__(self, lr: float = 0.1, batch_size: int = 8) -> None:
        super().__init__(lr=lr, batch_size=batch_size)
        self.loaded: dict[str, Any] | None = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(make_data(40, 1), batch_size=self.batch_size)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["seen_steps"] = self.global_step

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded = dict(checkpoint)


def test_continuing_from_a_checkpoint_restores_the_module() -> None:
    trial_cls = bridge.lightning_trial(Stateful)
    straight, _, _ = run_trial(bridge, trial_cls, HPARAMS, epochs=2, **BRIDGE_INIT)
    with bridge.init(hparams=HPARAMS, enable_tensorboard_logging=False, **BRIDGE_INIT) as ctx:
        first = trial_cls(ctx)
        trainer = bridge.Trainer(first, ctx)
        trainer.fit(max_length=bridge.Epoch(1), checkpoint_period=bridge.Epoch(1))
        checkpoint = trainer.checkpoints[-1]
    with bridge.init(hparams=HPARAMS, enable_tensorboard_logging=False, **BRIDGE_INIT) as ctx:
        second = trial_cls(ctx)
        bridge.Trainer(second, ctx).fit(max_length=bridge.Epoch(2), latest_checkpoint=checkpoint)
    module = second.lightning_module
    assert module.loaded == {"seen_steps": 5}
    assert module.trainer.global_step == 10
    got, want = weights(module), weights(straight.lightning_module)
    assert all(torch.equal(got[k], want[k]) for k in want)
