"""Trainer.fit on Lightning: schedule, callbacks, checkpoints, logging, the public TrialModule."""

from __future__ import annotations

import json
import pathlib
import pickle
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

import lightning_bridge as pytorch
from tests._trials import LinearTrial, Recorder, fit, quiet_init

# 32 training records / batch 8 = 4 batches per epoch.


def test_schedule_callbacks_and_final_validation() -> None:
    trial, trainer = fit(
        max_length=pytorch.Epoch(2),
        validation_period=pytorch.Batch(3),
        reporting_period=pytorch.Batch(2),
        checkpoint_period=pytorch.Epoch(1),
    )
    names = trial.recorder.names()
    assert names[:3] == ["on_trial_startup", "on_training_start", "on_training_epoch_start"]
    assert names[-1] == "on_trial_shutdown"
    # Validations after batches 3 and 6 (period) and at the end (8, not current): three.
    vals = [a for n, a in trial.recorder.calls if n == "on_validation_end"]
    assert len(vals) == 3 and all("val_loss" in v for v in vals)
    # Windows close at every boundary: batches 2, 3, 4, 6 (2 and 3), 8.
    windows = [a for n, a in trial.recorder.calls if n == "on_training_workload_end"]
    assert [w[0]["batches"] for w in windows] == [2, 3, 4, 6, 8]
    assert [w[1] for w in windows] == [2, 1, 1, 2, 2]
    assert [w[0]["epochs"] for w in windows] == [0, 0, 1, 1, 2]
    # Checkpoints: every validation ('best' falls back to 'all' without a searcher metric)
    # plus the epoch-1 period at batch 4; batch 8 is validated then checkpointed once.
    assert len(trainer.checkpoints) == 4
    assert all(p.is_dir() for p in trainer.checkpoints)


def test_training_metrics_are_window_means() -> None:
    trial, _ = fit(max_length=pytorch.Batch(4), reporting_period=pytorch.Batch(4))
    (avg, count) = next(a for n, a in trial.recorder.calls if n == "on_training_workload_end")
    assert count == 4
    # Recompute the four losses from scratch with the same seed and data order.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    from tests._trials import RegressionData

    data = RegressionData(32)
    losses = []
    for b in range(4):
        x, y = data.x[b * 8 : (b + 1) * 8], data.y[b * 8 : (b + 1) * 8]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert avg["loss"] == pytest.approx(sum(losses) / 4, rel=1e-6)
    assert torch.allclose(trial.model.weight, model.weight)


def test_checkpoint_layout() -> None:
    trial, trainer = fit(
        max_length=pytorch.Batch(5),
        init_kwargs={"hparams": {"global_batch_size": 8, "lr": 0.05}, "exp_conf": {"x": 1}},
    )
    (ckpt,) = trainer.checkpoints
    assert ckpt.parent == pathlib.Path.cwd() / "checkpoints"
    # As Determined's local mode: the working directory's code rides along in `code/`.
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "code",
        "load_data.json",
        "metadata.json",
        "state_dict.pth",
        "trial_state.pkl",
    ]
    state = torch.load(ckpt / "state_dict.pth", weights_only=True)
    assert sorted(state) == [
        "callbacks",
        "lightning_bridge",
        "lr_schedulers_state_dict",
        "models_state_dict",
        "optimizers_state_dict",
        "rng_state",
    ]
    assert torch.equal(state["models_state_dict"][0]["weight"], trial.model.weight.detach())
    assert set(state["rng_state"]) >= {"cpu_rng_state", "np_rng_state", "random_rng_state"}
    # The bridge's own entry: where the data pass started (exact continuation), no pending
    # gradients at a step boundary.
    assert sorted(state["lightning_bridge"]) == ["gradients", "pass_start_rng"]
    assert state["lightning_bridge"]["gradients"] is None
    with open(ckpt / "trial_state.pkl", "rb") as f:
        assert pickle.load(f)["batches_trained"] == 5
    load_data = json.loads((ckpt / "load_data.json").read_text())
    assert load_data["trial_cls_spec"] == "tests._trials:LinearTrial"
    assert load_data["hparams"] == {"global_batch_size": 8, "lr": 0.05}
    assert load_data["experiment_config"] == {"x": 1}
    assert json.loads((ckpt / "metadata.json").read_text())["steps_completed"] == 5
    # No partial directories are left behind.
    assert not [p for p in ckpt.parent.iterdir() if p.name.startswith(".")]


def test_checkpoint_dir_from_argument_and_config(tmp_path: pathlib.Path) -> None:
    _, trainer = fit(max_length=pytorch.Batch(2), init_kwargs={"checkpoint_dir": tmp_path / "a"})
    assert trainer.checkpoints[0].parent == tmp_path / "a"
    conf = {"checkpoint_storage": {"type": "shared_fs", "host_path": str(tmp_path / "b")}}
    _, trainer = fit(max_length=pytorch.Batch(2), init_kwargs={"exp_conf": conf})
    assert trainer.checkpoints[0].parent == tmp_path / "b"


def test_checkpoint_policy_none_still_checkpoints_at_end() -> None:
    trial, trainer = fit(
        max_length=pytorch.Batch(6), validation_period=pytorch.Batch(2), checkpoint_policy="none"
    )
    assert len(trainer.checkpoints) == 1
    assert trial.recorder.names().count("on_validation_end") == 3


def test_checkpoint_policy_best_uses_searcher_metric() -> None:
    class Scripted(LinearTrial):
        scores = iter([3.0, 1.0, 2.0, 0.5])

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            return {"score": self.current}

        def on_val(self) -> None:
            self.current = next(self.scores)

    class Feeder(pytorch.PyTorchCallback):
        def __init__(self, trial: Scripted) -> None:
            self.trial = trial

        def on_validation_start(self) -> None:
            self.trial.on_val()

    class Trial(Scripted):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            return {"feeder": Feeder(self), "recorder": self.recorder}

    conf = {"searcher": {"metric": "score", "smaller_is_better": True}}
    _, trainer = fit(
        Trial,
        init_kwargs={"exp_conf": conf},
        max_length=pytorch.Batch(8),
        validation_period=pytorch.Batch(2),
        checkpoint_policy="best",
    )
    # Validations score 3 (best), 1 (best), 2 (worse), 0.5 (best): three checkpoints.
    assert [
        json.loads((p / "metadata.json").read_text())["steps_completed"]
        for p in trainer.checkpoints
    ] == [2, 4, 8]


def test_test_mode_trains_one_batch() -> None:
    trial, trainer = fit(max_length=pytorch.Epoch(5), test_mode=True)
    windows = [a for n, a in trial.recorder.calls if n == "on_training_workload_end"]
    assert [w[0]["batches"] for w in windows] == [1]
    assert trial.recorder.names().count("on_validation_end") == 1
    assert len(trainer.checkpoints) == 1


def test_stop_requested_checkpoints_and_ends() -> None:
    class Stopper(LinearTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            if batch_idx == 2:
                self.context.set_stop_requested(True)
            return super().train_batch(batch, epoch_idx, batch_idx)

    trial, trainer = fit(Stopper, max_length=pytorch.Batch(20), reporting_period=pytorch.Batch(1))
    windows = [a for n, a in trial.recorder.calls if n == "on_training_workload_end"]
    assert windows[-1][0]["batches"] == 3
    assert "on_validation_end" not in trial.recorder.names()
    assert len(trainer.checkpoints) == 1


def test_step_zero_validation_runs_before_training() -> None:
    trial, _ = fit(max_length=pytorch.Batch(2), step_zero_validation=True)
    names = trial.recorder.names()
    assert names.index("on_validation_start") < names.index("on_training_epoch_start")


def test_aggregation_frequency_steps_every_other_batch() -> None:
    class Watch(LinearTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            before = self.model.weight.detach().clone()
            out = super().train_batch(batch, epoch_idx, batch_idx)
            changed = not torch.equal(before, self.model.weight.detach())
            self.changes = [*getattr(self, "changes", []), changed]
            return out

    trial, _ = fit(Watch, init_kwargs={"aggregation_frequency": 2}, max_length=pytorch.Batch(6))
    assert trial.changes == [False, True] * 3


@pytest.mark.parametrize(
    ("mode", "frequency", "expected_steps"),
    [
        (pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH, 1, 6),
        (pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH, 2, 3),
        (pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH, 1, 1),
        (pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP, 3, 2),
        (pytorch.LRScheduler.StepMode.MANUAL_STEP, 1, 0),
    ],
)
def test_lr_step_modes(mode: Any, frequency: int, expected_steps: int) -> None:
    class Scheduled(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5)
            self.sched = context.wrap_lr_scheduler(sched, mode, frequency=frequency)

    trial, _ = fit(Scheduled, max_length=pytorch.Batch(6))
    assert trial.sched.last_epoch == expected_steps
    assert trial.opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**expected_steps)


def test_resume_continues_counting() -> None:
    _, first = fit(max_length=pytorch.Batch(3))
    trial, second = fit(max_length=pytorch.Batch(6), latest_checkpoint=str(first.checkpoints[-1]))
    assert trial.recorder.calls[0] == ("on_trial_startup", 3)
    windows = [a for n, a in trial.recorder.calls if n == "on_training_workload_end"]
    assert windows[-1][0]["batches"] == 6


def test_tensorboard_writer_and_logged_metrics() -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Writes(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            self.writer = context.get_tensorboard_writer()

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            self.writer.add_scalar("custom", float(batch_idx), batch_idx)
            return super().train_batch(batch, epoch_idx, batch_idx)

    with quiet_init() as ctx:
        trial = Writes(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(4), reporting_period=pytorch.Batch(2)
        )
        tb_dir = ctx.get_tensorboard_path()
    tags: set[str] = set()
    for event_file in tb_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(event_file))
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
    assert {"custom", "Determined/loss", "Determined/val_loss"} <= tags


def test_set_profiler_writes_a_trace() -> None:
    class Profiled(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            context.set_profiler(
                schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
            )

    with quiet_init() as ctx:
        trial = Profiled(ctx)
        pytorch.Trainer(trial, ctx).fit(max_length=pytorch.Batch(4))
        traces = list(ctx.get_tensorboard_path().rglob("*.json")) + list(
            ctx.get_tensorboard_path().rglob("*.txt")
        )
    assert traces, "the PyTorch profiler wrote nothing"


def test_trial_module_under_a_plain_lightning_trainer() -> None:
    with quiet_init() as ctx:
        trial = LinearTrial(ctx)
        module = pytorch.TrialModule(trial, ctx)
        before = trial.model.weight.detach().clone()
        pl.Trainer(
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=2,
        ).fit(module)
    names = trial.recorder.names()
    assert names.count("on_training_epoch_end") == 2
    assert names.count("on_validation_end") == 2  # Lightning validates every epoch
    assert module.state.batches_trained == 8
    assert not torch.equal(before, trial.model.weight.detach())
    assert names[-1] == "on_trial_shutdown"


def test_recorder_sees_callbacks_in_reference_order_around_checkpoint() -> None:
    trial, _ = fit(max_length=pytorch.Batch(2), validation_period=pytorch.Batch(2))
    names = trial.recorder.names()
    tail = names[names.index("on_training_workload_end") :]
    assert tail == [
        "on_training_workload_end",
        "on_validation_start",
        "on_validation_end",
        "on_checkpoint_write_end",
        "on_trial_shutdown",
    ]


def test_recorder_is_a_callback() -> None:
    assert isinstance(Recorder(), pytorch.PyTorchCallback)


def test_resume_by_checkpoint_id_under_the_checkpoint_dir() -> None:
    _, first = fit(max_length=pytorch.Batch(3))
    uuid = first.checkpoints[-1].name
    trial, _ = fit(max_length=pytorch.Batch(4), latest_checkpoint=uuid)
    assert trial.recorder.calls[0] == ("on_trial_startup", 3)


def test_bf16_mixed_precision_on_cpu() -> None:
    class Dtypes(LinearTrial):
        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            self.forward_dtype = self.model(batch[0]).dtype
            return super().train_batch(batch, epoch_idx, batch_idx)

    trial, _ = fit(Dtypes, init_kwargs={"precision": "bf16-mixed"}, max_length=pytorch.Batch(4))
    assert trial.forward_dtype == torch.bfloat16  # Lightning's autocast wraps train_batch
    assert trial.model.weight.dtype == torch.float32  # master weights stay in float32
    losses = [a[0]["loss"] for n, a in trial.recorder.calls if n == "on_training_workload_end"]
    assert losses and all(np.isfinite(losses))


def test_a_fabric_strategy_instance_runs_the_fit() -> None:
    """The fit runs on lightning.Fabric: an instance of one of its strategies is taken as is."""
    from lightning.fabric.strategies import SingleDeviceStrategy

    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    trial, trainer = fit(init_kwargs={"strategy": strategy}, max_length=pytorch.Batch(4))
    assert trainer.fabric.strategy is strategy
    assert trainer.last_validation_metrics  # it trained and validated


def test_a_lightning_trainer_strategy_is_refused_before_the_trial_is_built() -> None:
    """lightning.Trainer's strategy classes are not Fabric's: refused in init(), naming
    Fabric's class of the same name, instead of failing inside Fabric after the build."""
    from lightning.pytorch.strategies import DDPStrategy

    with pytest.raises(pytorch.InvalidArgumentError) as info:
        with quiet_init(strategy=DDPStrategy()):
            pass
    message = str(info.value)
    assert "strategy=: lightning.pytorch.strategies.ddp.DDPStrategy" in message
    assert "lightning.fabric.strategies.DDPStrategy(...)" in message


def test_schedule_answers_each_batch_in_determined_order() -> None:
    from lightning_bridge.translation.fit._schedule import Boundary, Schedule

    schedule = Schedule.for_fit(
        max_length=pytorch.Epoch(2),
        validation_period=pytorch.Batch(3),
        checkpoint_period=pytorch.Epoch(1),
        reporting_period=pytorch.Batch(2),
    )
    epoch_len = 4
    reached = {n: schedule.reached(n, epoch_len) for n in range(1, 9)}
    assert reached[1] == []
    assert reached[2] == [Boundary.REPORT]
    assert reached[3] == [Boundary.VALIDATE]
    assert reached[4] == [Boundary.CHECKPOINT, Boundary.REPORT]
    assert reached[6] == [Boundary.VALIDATE, Boundary.REPORT]
    assert reached[8] == [Boundary.LENGTH, Boundary.CHECKPOINT, Boundary.REPORT]
    assert schedule.remaining(batches_trained=8, epochs_trained=1) == 1
    assert schedule.remaining(batches_trained=8, epochs_trained=2) == 0
    assert schedule.total_batches(epoch_len) == 8
    # A search's rungs are validations too; test mode ends after one batch.
    with_rungs = schedule.with_rungs(frozenset({5}), frozenset({1}))
    assert with_rungs.reached(5, epoch_len) == [Boundary.VALIDATE]
    assert with_rungs.reached(4, epoch_len) == [
        Boundary.VALIDATE,
        Boundary.CHECKPOINT,
        Boundary.REPORT,
    ]
    test = Schedule.for_fit(
        max_length=pytorch.Batch(100),
        validation_period=None,
        checkpoint_period=None,
        reporting_period=pytorch.Batch(100),
        test_mode=True,
    )
    assert test.reached(1, epoch_len) == [Boundary.LENGTH]
    assert test.remaining(1, 0) == 0 and test.total_batches(epoch_len) == 1
    with pytest.raises(ValueError, match="validation_period must count batches with integers"):
        Schedule.for_fit(
            max_length=pytorch.Batch(10),
            validation_period=pytorch.Batch("4"),
            checkpoint_period=None,
            reporting_period=pytorch.Batch(1),
        )
