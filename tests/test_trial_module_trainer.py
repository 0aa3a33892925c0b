"""A trial in the user's own `lightning.Trainer` (`TrialModule`): Lightning's schedule, stop
requests, clipping, the Trainer arguments it maps or refuses (one process, in process)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger

import lightning_bridge as pytorch
from lightning_bridge.translation.fit._trial_module import INEXACT_RESTART, RESTARTS_EXACTLY
from tests._trials import LinearTrial, RegressionData, quiet_init

N_TRAIN = 96  # 12 batches of 8 per epoch
QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu"}


class PlainModule(pl.LightningModule):
    """LinearTrial as a plain LightningModule: the same data, the same epochs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(RegressionData(N_TRAIN), batch_size=8)

    def val_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(RegressionData(16, seed=1), batch_size=8)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.model(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.model.parameters(), lr=0.05)


class Where(pl.Callback):
    """Where Lightning validated (each pass's batches) and where the fit ended, in steps."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self._batches = 0

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._batches += 1

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        kind = "sanity check" if trainer.sanity_checking else "validation"
        self.events.append((f"{kind} of {self._batches} batches", trainer.global_step))
        self._batches = 0

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.events.append((f"end in epoch {trainer.current_epoch}", trainer.global_step))


class LogSteps(Logger):
    """Records at which step the Trainer's loggers got training and validation metrics."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: pl.Trainer | None = None
        self.logged: set[tuple[str, int]] = set()

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        assert self.trainer is not None
        kind = "validation" if any("val_" in k for k in metrics) else "training"
        self.logged.add((kind, self.trainer.global_step))


def _run(module: pl.LightningModule, folder: pathlib.Path, **trainer_kwargs: Any) -> Any:
    where, logger = Where(), LogSteps()
    saves = ModelCheckpoint(dirpath=folder, every_n_train_steps=5, save_top_k=-1, save_last=True)
    trainer = pl.Trainer(
        logger=logger, callbacks=[where, saves], default_root_dir=folder, **QUIET, **trainer_kwargs
    )
    logger.trainer = trainer
    trainer.fit(module)
    return where.events, sorted(logger.logged), sorted(p.name for p in folder.glob("*.ckpt"))


SCHEDULES = {
    "val_check_interval int across epochs": {
        "val_check_interval": 10,
        "check_val_every_n_epoch": None,
        "max_steps": 36,
    },
    "val_check_interval float": {"val_check_interval": 0.5, "max_epochs": 2},
    "check_val_every_n_epoch": {"check_val_every_n_epoch": 2, "max_epochs": 4},
    "log_every_n_steps and limit_train_batches": {
        "log_every_n_steps": 3,
        "limit_train_batches": 5,
        "max_epochs": 3,
    },
    "limits as fractions, no sanity check": {
        "limit_train_batches": 0.5,
        "limit_val_batches": 0.5,
        "num_sanity_val_steps": 0,
        "max_steps": 20,
    },
    "limit_val_batches and sanity steps": {
        "limit_val_batches": 1,
        "num_sanity_val_steps": 1,
        "log_every_n_steps": 5,
        "max_epochs": 2,
    },
    "max_time": {"max_time": {"seconds": 0}, "max_epochs": 3},
    "max_steps inside an epoch": {"max_steps": 17, "log_every_n_steps": 4},
    # The trial's aggregation_frequency is Lightning's accumulate_grad_batches: steps (and
    # so max_steps, log_every_n_steps, every_n_train_steps) count every 2 batches.
    "accumulate_grad_batches": {
        "accumulate_grad_batches": 2,
        "max_steps": 15,
        "log_every_n_steps": 4,
        "val_check_interval": 5,
    },
}


@pytest.mark.parametrize("arguments", list(SCHEDULES))
def test_a_trial_module_validates_logs_and_checkpoints_where_a_plain_module_does(
    tmp_path: pathlib.Path, arguments: str
) -> None:
    kwargs = SCHEDULES[arguments]
    plain = _run(PlainModule(), tmp_path / "plain", **kwargs)
    hparams = {"global_batch_size": 8, "n_train": N_TRAIN}
    aggregation = kwargs.get("accumulate_grad_batches", 1)
    with quiet_init(hparams=hparams, aggregation_frequency=aggregation) as ctx:
        trial = LinearTrial(ctx)
        module = pytorch.TrialModule(trial, ctx)
        wrapped = _run(module, tmp_path / "trial", **kwargs)
    assert wrapped[0] == plain[0]  # validations (and their batches), the fit's end
    assert wrapped[1] == plain[1]  # where the loggers got metrics
    assert wrapped[2] == plain[2]  # ModelCheckpoint's files
    validations = [step for what, step in plain[0] if what.startswith("validation")]
    ran = [n for n, _ in trial.recorder.calls if n == "on_validation_end"]
    assert len(ran) == len(validations)  # the trial validated at each, the sanity check aside
    if arguments == "val_check_interval int across epochs":
        assert validations == [10, 20, 30]


class StopsAt(LinearTrial):
    """Asks to stop while training batch `stop_at` (hparam), or after its first validation."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if batch_idx == self.hp.get("stop_at"):
            self.context.set_stop_requested(True)
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        if self.hp.get("stop_at_validation"):
            self.context.set_stop_requested(True)
        return super().evaluate_batch(batch, batch_idx)


def _stopped(hparams: dict[str, Any], **trainer_kwargs: Any) -> tuple[Any, Any, pl.Trainer]:
    with quiet_init(hparams={"global_batch_size": 8, "n_train": N_TRAIN, **hparams}) as ctx:
        trial = StopsAt(ctx)
        module = pytorch.TrialModule(trial, ctx)
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, **QUIET, **trainer_kwargs)
        trainer.fit(module)
    return trial, module, trainer


def test_a_stop_request_stops_the_trainer_at_the_next_boundary_as_determined_does() -> None:
    # Determined acts on set_stop_requested after the next boundary the batch reaches: here
    # the report after batch 10 (every 5). The bridge's own fit on Determined's schedule says
    # where; under a lightning.Trainer the report boundaries are log_every_n_steps.
    hparams = {"stop_at": 6}
    with quiet_init(hparams={"global_batch_size": 8, "n_train": N_TRAIN, **hparams}) as ctx:
        reference = StopsAt(ctx)
        pytorch.Trainer(reference, ctx).fit(
            max_length=pytorch.Batch(36), reporting_period=pytorch.Batch(5)
        )
    trial, module, trainer = _stopped(hparams, max_steps=36, log_every_n_steps=5)
    reference_batches = [a for n, a in reference.recorder.calls if n == "on_training_workload_end"]
    assert reference_batches[-1][0]["batches"] == 10
    assert trainer.should_stop and module.stop_requested
    assert module.state.batches_trained == trainer.global_step == 10
    torch.testing.assert_close(trial.model.weight, reference.model.weight, rtol=0, atol=0)


def test_a_stop_request_at_a_validation_stops_after_it() -> None:
    trial, module, trainer = _stopped(
        {"stop_at_validation": True},
        max_epochs=3,
        val_check_interval=4,
        num_sanity_val_steps=0,
    )
    assert module.stop_requested and trainer.global_step == 4
    assert [n for n, _ in trial.recorder.calls].count("on_validation_end") == 1


def test_a_stop_request_waits_for_min_steps_as_lightning_does() -> None:
    _, module, trainer = _stopped({"stop_at": 2}, max_epochs=3, min_steps=20, log_every_n_steps=1)
    assert module.stop_requested and trainer.global_step == 20


class ClipsItself(LinearTrial):
    """Steps with the trial's own `clip_grads` when the `clip` hparam names an algorithm."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y) * 10
        self.context.backward(loss)
        clip = self.hp.get("clip")
        clip_grads = None
        if clip == "norm":
            clip_grads = lambda params: torch.nn.utils.clip_grad_norm_(params, 0.3)  # noqa: E731
        elif clip == "value":
            clip_grads = lambda params: torch.nn.utils.clip_grad_value_(params, 0.3)  # noqa: E731
        self.context.step_optimizer(self.opt, clip_grads=clip_grads)
        return {"loss": loss}


def _weights(
    hparams: dict[str, Any], init_kwargs: dict[str, Any] | None = None, **trainer_kwargs: Any
) -> torch.Tensor:
    base = {"global_batch_size": 8, "n_train": N_TRAIN}
    with quiet_init(hparams={**base, **hparams}, **(init_kwargs or {})) as ctx:
        trial = ClipsItself(ctx)
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, **QUIET, **trainer_kwargs)
        trainer.fit(pytorch.TrialModule(trial, ctx))
    return torch.cat([p.detach().flatten() for p in trial.model.parameters()])


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_the_trainers_gradient_clipping_equals_the_trials_own(algorithm: str) -> None:
    own = _weights({"clip": algorithm}, max_steps=24)
    trainers = _weights({}, max_steps=24, gradient_clip_val=0.3, gradient_clip_algorithm=algorithm)
    unclipped = _weights({}, max_steps=24)
    assert not torch.allclose(own, unclipped)  # the clipping mattered
    torch.testing.assert_close(trainers, own, rtol=0, atol=0)


def test_accumulate_grad_batches_is_the_trials_aggregation_frequency() -> None:
    # One meaning: the trial's aggregation_frequency; the Trainer's value agrees or is left out.
    agreed = _weights({}, {"aggregation_frequency": 2}, max_steps=6, accumulate_grad_batches=2)
    alone = _weights({}, {"aggregation_frequency": 2}, max_steps=6)
    torch.testing.assert_close(agreed, alone, rtol=0, atol=0)


def test_a_different_accumulate_grad_batches_is_refused_with_one_message() -> None:
    with quiet_init(hparams={"global_batch_size": 8}) as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        trainer = pl.Trainer(logger=False, max_steps=2, accumulate_grad_batches=4, **QUIET)
        with pytest.raises(pytorch.InvalidArgumentError) as err:
            trainer.fit(module)
    message = str(err.value)
    assert "accumulate_grad_batches=4" in message and "aggregation_frequency=1" in message
    assert "init(aggregation_frequency=4)" in message


def test_max_steps_counts_optimizer_steps() -> None:
    # As for any manual-optimization LightningModule: every optimizer step counts, so 6 steps
    # of 2 aggregated batches are 12 batches, and 10 steps of two optimizers 5 batches.
    from tests._dist_script import TwoModelTrial

    hparams = {"global_batch_size": 8, "n_train": N_TRAIN}
    with quiet_init(hparams=hparams, aggregation_frequency=2) as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        trainer = pl.Trainer(
            logger=False,
            enable_checkpointing=False,
            max_steps=6,
            accumulate_grad_batches=2,
            **QUIET,
        )
        trainer.fit(module)
    assert module.state.batches_trained == 12 and trainer.global_step == 6
    assert trainer.accumulate_grad_batches == 2  # Lightning counts logging steps as it would
    with quiet_init(hparams=hparams) as ctx:
        module = pytorch.TrialModule(TwoModelTrial(ctx), ctx)
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, max_steps=10, **QUIET)
        trainer.fit(module)
    assert trainer.global_step == 10 and module.state.batches_trained == 5


# ----- in new processes: resuming from Lightning's checkpoints, DDP with Lightning's defaults


REPO = pathlib.Path(__file__).resolve().parents[1]


def _script(
    folder: pathlib.Path, name: str, config: dict[str, Any], torchrun: bool = False
) -> dict[int, dict[str, Any]]:
    """Run tests/_trial_module_script.py (under torchrun: two processes); each rank's record."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(REPO / "tests" / "_trial_module_script.py"), str(folder / name), json.dumps(config)]
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {
        int(p.name.split(".")[-2]): json.loads(p.read_text()) for p in folder.glob(f"{name}.*.json")
    }


Uninterrupted = Callable[[dict[str, Any]], tuple[pathlib.Path, dict[int, dict[str, Any]]]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The script's single-process run for some Trainer arguments (its folder, its record),
    with its checkpoints in the folder's ``ck/``: run once per module for each set of
    arguments, since every resumed or two-process run of the module compares with one of a
    few such runs (the runs that compare do not write there)."""
    runs: dict[str, tuple[pathlib.Path, dict[int, dict[str, Any]]]] = {}

    def run(trainer: dict[str, Any]) -> tuple[pathlib.Path, dict[int, dict[str, Any]]]:
        key = json.dumps(trainer, sort_keys=True)
        if key not in runs:
            folder = tmp_path_factory.mktemp("uninterrupted")
            config = {"ckpt_dir": str(folder / "ck"), "trainer": trainer}
            runs[key] = folder, _script(folder, "whole", config)
        return runs[key]

    return run


def _resumed_like_uninterrupted(
    whole: dict[str, Any], resumed: dict[str, Any], at_step: int
) -> None:
    assert resumed["trained"] == whole["trained"][at_step:]  # the same batches, in order
    assert resumed["validated_at"] == [s for s in whole["validated_at"] if s > at_step]
    assert (
        resumed["val_loss"][-len(resumed["validated_at"]) :]
        == whole["val_loss"][-len(resumed["validated_at"]) :]
    )
    assert resumed["weights"] == whole["weights"]  # bit for bit
    assert resumed["global_step"] == whole["global_step"]


SHUFFLED = {"val_check_interval": 0.5}  # 12-batch epochs: validations every 6 batches

# Lightning 2.4 itself restarts a checkpoint taken inside a run one batch late (a plain
# LightningModule too); the module warns there (`test_lightning_2_4_warns_...`).
EXACT_RESTART = pytest.mark.skipif(not RESTARTS_EXACTLY, reason=INEXACT_RESTART)


# Each older Lightning minor resumes from one checkpoint: inside an epoch where it restarts
# exactly, at an epoch's end where it does not (2.4); the other cases, against the latest only.
@pytest.mark.parametrize(
    ("length", "checkpoint", "at_step"),
    [
        pytest.param({"max_epochs": 3}, "epoch=1-step=15.ckpt", 15, marks=EXACT_RESTART),
        pytest.param(
            {"max_epochs": 3},
            "end-of-epoch=0.ckpt",  # an epoch's end
            12,
            marks=[pytest.mark.latest_lightning] if RESTARTS_EXACTLY else [],
        ),
        pytest.param(
            {"max_steps": 32},
            "epoch=1-step=20.ckpt",
            20,
            marks=[EXACT_RESTART, pytest.mark.latest_lightning],
        ),
        pytest.param(
            {"max_steps": 32},
            "end-of-epoch=1.ckpt",
            24,
            marks=[EXACT_RESTART, pytest.mark.latest_lightning],
        ),
    ],
)
def test_ckpt_path_resumes_a_shuffled_trial_exactly_in_a_new_process(
    tmp_path: pathlib.Path,
    uninterrupted: Uninterrupted,
    length: dict[str, Any],
    checkpoint: str,
    at_step: int,
) -> None:
    trainer = {**SHUFFLED, **length}
    folder, whole = uninterrupted(trainer)
    assert (
        len(whole[0]["trained"])
        == whole[0]["global_step"]
        == (36 if "max_epochs" in length else 32)
    )
    resumed = _script(
        tmp_path, "resumed", {"ckpt_path": str(folder / "ck" / checkpoint), "trainer": trainer}
    )
    _resumed_like_uninterrupted(whole[0], resumed[0], at_step)


@EXACT_RESTART
@pytest.mark.latest_lightning  # the older minors resume from a step's checkpoint above
def test_an_interrupted_fit_continues_from_last_ckpt_as_if_uninterrupted(
    tmp_path: pathlib.Path, uninterrupted: Uninterrupted
) -> None:
    _, whole = uninterrupted({**SHUFFLED, "max_steps": 32})
    first = {"ckpt_dir": str(tmp_path / "ck"), "trainer": {**SHUFFLED, "max_steps": 20}}
    _script(tmp_path, "first", first)
    last = str(tmp_path / "ck" / "last.ckpt")
    resumed = _script(
        tmp_path, "resumed", {"ckpt_path": last, "trainer": {**SHUFFLED, "max_steps": 32}}
    )
    _resumed_like_uninterrupted(whole[0], resumed[0], 20)


def _like_one_process(one: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> None:
    assert sorted(ranks) == [0, 1]
    for rank in ranks.values():
        assert rank["size"] == rank["world_size"] == 2
        assert rank["global_step"] == one["global_step"]
        assert rank["validated_at"] == one["validated_at"]  # every rank validated, once each
        for got, want in zip(rank["weights"], one["weights"], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        # Each rank validated its shard; the reduced metric is the whole set's.
        np.testing.assert_allclose(rank["val_loss"], one["val_loss"], rtol=1e-5)
        # Every rank trained half of each global batch (Determined's sharding).
        assert [i for i, _ in rank["trained"]] == [i for i, _ in one["trained"]]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    sums = [a + b for (_, a), (_, b) in zip(ranks[0]["trained"], ranks[1]["trained"], strict=True)]
    np.testing.assert_allclose(sums, [s for _, s in one["trained"]], atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_find_unused_parameters_true", "torchrun"])
def test_two_processes_under_lightnings_defaults_train_like_one(
    tmp_path: pathlib.Path, uninterrupted: Uninterrupted, strategy: str
) -> None:
    trainer = {**SHUFFLED, "max_epochs": 2}
    one = uninterrupted(trainer)[1][0]
    if strategy == "torchrun":
        # A train.py started by torchrun: init() finds the processes, Trainer(devices=2).
        config = {"devices": 2, "init_engine": False, "trainer": trainer}
        ranks = _script(tmp_path, "two", config, torchrun=True)
    else:
        ranks = _script(tmp_path, "two", {"devices": 2, "strategy": strategy, "trainer": trainer})
    _like_one_process(one, ranks)


@pytest.mark.slow
def test_ddp_resumes_from_a_mid_epoch_checkpoint_exactly(tmp_path: pathlib.Path) -> None:
    ddp = {"devices": 2, "strategy": "ddp"}
    trainer = {**SHUFFLED, "max_epochs": 2}
    whole = _script(
        tmp_path, "whole", {**ddp, "ckpt_dir": str(tmp_path / "ck"), "trainer": trainer}
    )
    checkpoint = str(tmp_path / "ck" / "epoch=1-step=15.ckpt")
    resumed = _script(tmp_path, "resumed", {**ddp, "ckpt_path": checkpoint, "trainer": trainer})
    for rank in (0, 1):
        _resumed_like_uninterrupted(whole[rank], resumed[rank], 15)


@pytest.mark.slow
def test_ddp_spawn_is_refused_with_one_message(tmp_path: pathlib.Path) -> None:
    # Lightning pickles the module to processes it spawns: their trials would train, the
    # caller's would not. The refusal names the strategies that work.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    config = {
        "devices": 2,
        "strategy": "ddp_spawn",
        "init_engine": False,
        "trainer": {"max_steps": 2},
    }
    cmd = [sys.executable, str(REPO / "tests" / "_trial_module_script.py"), str(tmp_path / "x")]
    done = subprocess.run(
        [*cmd, json.dumps(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "A TrialModule cannot train under DDPStrategy with start method 'spawn'" in done.stderr
    assert "Use strategy='ddp'" in done.stderr and "torchrun" in done.stderr


@pytest.mark.slow
def test_a_stop_request_on_one_rank_stops_every_rank_after_the_same_batch(
    tmp_path: pathlib.Path,
) -> None:
    # Rank 1 alone asks while training batch 6; the next boundary is the report after batch
    # 10 (log_every_n_steps=5): both ranks stop there.
    config = {
        "devices": 2,
        "strategy": "ddp",
        "hparams": {"stop_at": 6, "stop_rank": 1},
        "trainer": {"max_epochs": 3, "log_every_n_steps": 5, "num_sanity_val_steps": 0},
    }
    ranks = _script(tmp_path, "stop", config)
    for rank in ranks.values():
        assert rank["should_stop"] and rank["stop_requested"]
        assert rank["global_step"] == len(rank["trained"]) == 10
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
def test_a_context_built_for_one_process_under_a_ddp_trainer_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    # init() without the devices: the context splits the global batch for one process.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    config = {"devices": 2, "strategy": "ddp", "init_engine": False, "trainer": {"max_steps": 2}}
    cmd = [sys.executable, str(REPO / "tests" / "_trial_module_script.py"), str(tmp_path / "x")]
    done = subprocess.run(
        [*cmd, json.dumps(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "The Trainer runs 2 process(es) but the trial's context was built for 1" in done.stderr
    assert "init(accelerator=..., devices=2, num_nodes=1, strategy='ddp')" in done.stderr


@pytest.mark.skipif(RESTARTS_EXACTLY, reason="this Lightning restarts a checkpoint exactly")
def test_lightning_2_4_warns_that_its_restart_is_one_batch_late(tmp_path: pathlib.Path) -> None:
    hparams = {"global_batch_size": 8, "n_train": N_TRAIN}
    with quiet_init(hparams=hparams) as ctx:
        saver = ModelCheckpoint(tmp_path, every_n_train_steps=5, save_top_k=-1, filename="{step}")
        trainer = pl.Trainer(logger=False, callbacks=[saver], **QUIET, max_steps=7)
        trainer.fit(pytorch.TrialModule(LinearTrial(ctx), ctx))
    with quiet_init(hparams=hparams) as ctx:
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, **QUIET, max_steps=9)
        with pytest.warns(UserWarning, match=r"Install lightning>=2\.5"):
            trainer.fit(
                pytorch.TrialModule(LinearTrial(ctx), ctx), ckpt_path=tmp_path / "step=5.ckpt"
            )
