"""A TrialModule in a lightning.Trainer and Determined checkpoints, both ways.

`TrialModule(latest_checkpoint=...)` continues a checkpoint written by `Trainer.fit` (the
layout Determined writes) exactly as `fit(latest_checkpoint=...)` does: weights, optimizer, LR
schedule, RNG and data position, and Lightning's `max_steps` / `max_epochs` count from the
start of the run. `DeterminedCheckpoint` writes a TrialModule's checkpoints in that layout at
Lightning's checkpoint points, with Determined's retention, for `load_trial_from_checkpoint_
path`, `lightning-bridge run --resume` and `TrialModule(latest_checkpoint=...)`.
(Determined 0.38.1 reading them: tests/interop/test_trial_module_interop.py.)
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.contract import _import_map
from lightning_bridge.experiment.cli._main import main
from lightning_bridge.translation.fit._trial_module import INEXACT_RESTART, RESTARTS_EXACTLY
from tests._folders import (  # isolated_imports: an autouse fixture
    BASE_CONFIG,
    checkpoint_weights,
    isolated_imports,  # noqa: F401
    kept_checkpoints,
    steps_completed,
    write_folder,
)
from tests._trials import quiet_init
from tests.test_resume import NoisyTrial

# NoisyTrial: 40 records, 8 a batch: 5 batches an epoch.
HPARAMS = {"global_batch_size": 8, "stop_at": None}
CONFIG = {"searcher": {"metric": "val_loss", "smaller_is_better": True}}


def _trainer(**kwargs: Any) -> pl.Trainer:
    """A quiet Trainer without Lightning's own checkpoints, logger or sanity check."""
    kwargs.setdefault("logger", False)
    return pl.Trainer(
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def _fit(stop_at: int | None, length: pytorch.TrainUnit) -> tuple[Any, pytorch.Trainer]:
    """`Trainer.fit` on NoisyTrial, stopped by the trial's stop request after `stop_at`."""
    with quiet_init(hparams={**HPARAMS, "stop_at": stop_at}, exp_conf=CONFIG) as ctx:
        trial = NoisyTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(max_length=length, reporting_period=pytorch.Batch(1))
    return trial, trainer


def _continue(checkpoint: pathlib.Path | str, **trainer_kwargs: Any) -> tuple[Any, Any]:
    """A TrialModule continuing `checkpoint` in a Trainer that never validates (validation
    draws from the RNG when its loader starts, so an uninterrupted `fit` without validations
    is the reference)."""
    with quiet_init(hparams=HPARAMS, exp_conf=CONFIG) as ctx:
        trial = NoisyTrial(ctx)
        recorder = _StartRecorder()
        trial.build_callbacks = lambda: {"start": recorder}
        module = pytorch.TrialModule(trial, ctx, latest_checkpoint=str(checkpoint))
        trainer = _trainer(limit_val_batches=0, **trainer_kwargs)
        trainer.fit(module)
    return trial, (module, trainer, recorder)


class _StartRecorder(pytorch.PyTorchCallback):
    def __init__(self) -> None:
        self.startup: list[tuple[int, str | None]] = []

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.startup.append((first_batch_idx, checkpoint_uuid))


def _same(a: Any, b: Any) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    ("stop_at", "length", "trainer_kwargs"),
    [
        pytest.param(7, pytorch.Batch(17), {"max_steps": 17}, id="mid-epoch-max-steps"),
        pytest.param(10, pytorch.Batch(17), {"max_steps": 17}, id="epoch-end-max-steps"),
        # Lightning 2.4 itself restarts a run's loops one batch late under max_epochs.
        pytest.param(
            10,
            pytorch.Epoch(4),
            {"max_epochs": 4},
            id="epoch-end-max-epochs",
            marks=pytest.mark.skipif(not RESTARTS_EXACTLY, reason=INEXACT_RESTART),
        ),
        pytest.param(
            7,
            pytorch.Epoch(4),
            {"max_epochs": 4},
            id="mid-epoch-max-epochs",
            marks=pytest.mark.skipif(not RESTARTS_EXACTLY, reason=INEXACT_RESTART),
        ),
    ],
)
def test_latest_checkpoint_continues_as_fit_does(
    stop_at: int, length: pytorch.TrainUnit, trainer_kwargs: dict[str, Any]
) -> None:
    reference, _ = _fit(None, length)
    _, first = _fit(stop_at, length)
    checkpoint = first.checkpoints[-1]
    trial, (module, trainer, recorder) = _continue(checkpoint, **trainer_kwargs)
    total = 17 if "max_steps" in trainer_kwargs else 20
    assert recorder.startup == [(stop_at, checkpoint.name)]
    assert module.state.batches_trained == total
    assert trainer.global_step == total  # Lightning counts from the run's start
    assert _same(trial, reference)
    assert trial.opt.param_groups[0]["lr"] == reference.opt.param_groups[0]["lr"]


def test_another_trials_checkpoint_starts_a_new_run_from_its_states() -> None:
    """As fit() does (Determined's warm start): the weights come back, the batch count and
    Lightning's counters start at 0."""
    import pickle
    import shutil

    _, first = _fit(7, pytorch.Batch(17))
    other = shutil.copytree(first.checkpoints[-1], pathlib.Path("other").resolve())
    state = pickle.loads((other / "trial_state.pkl").read_bytes())
    (other / "trial_state.pkl").write_bytes(pickle.dumps({**state, "trial_id": 7}))
    with quiet_init(hparams=HPARAMS, exp_conf=CONFIG) as ctx:
        trial = NoisyTrial(ctx)
        module = pytorch.TrialModule(trial, ctx, latest_checkpoint=str(other))
        starts: list[list[torch.Tensor]] = []

        class Start(pl.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, *args: Any) -> None:
                if not starts:
                    starts.append([p.detach().clone() for p in module.trial.model.parameters()])

        trainer = _trainer(max_steps=3, limit_val_batches=0, callbacks=[Start()])
        trainer.fit(module)
    assert module.state.batches_trained == 3 and trainer.global_step == 3
    saved = torch.load(other / "state_dict.pth", weights_only=False)["models_state_dict"][0]
    for got, want in zip(starts[0], saved.values(), strict=True):
        assert torch.equal(got, want)


def test_a_checkpoint_with_nothing_left_to_train_leaves_its_state_in_the_module() -> None:
    _, first = _fit(None, pytorch.Batch(6))
    batches: list[int] = []

    class Batches(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, *args: Any) -> None:
            batches.append(module.state.batches_trained)

    trial, (module, trainer, _) = _continue(
        first.checkpoints[-1], max_steps=6, callbacks=[Batches()]
    )
    assert batches == []  # nothing left to train
    assert trainer.global_step == 6 and module.state.batches_trained == 6
    saved = torch.load(first.checkpoints[-1] / "state_dict.pth", weights_only=False)
    for got, want in zip(
        trial.model.parameters(), saved["models_state_dict"][0].values(), strict=True
    ):
        assert torch.equal(got, want)


def test_latest_checkpoint_that_is_no_checkpoint_fails_with_one_message(
    tmp_path: pathlib.Path,
) -> None:
    with quiet_init(hparams=HPARAMS) as ctx:
        trial = NoisyTrial(ctx)
        with pytest.raises(pytorch.InvalidArgumentError, match="is not a checkpoint directory"):
            pytorch.TrialModule(trial, ctx, latest_checkpoint=str(tmp_path / "nowhere"))
        with pytest.raises(pytorch.InvalidCheckpointError, match="state_dict.pth"):
            pytorch.TrialModule(trial, ctx, latest_checkpoint=str(tmp_path))


def test_latest_checkpoint_and_ckpt_path_together_are_refused(tmp_path: pathlib.Path) -> None:
    _, first = _fit(3, pytorch.Batch(8))
    lightning_ckpt = tmp_path / "lightning.ckpt"
    with quiet_init(hparams=HPARAMS) as ctx:
        plain = _trainer(max_steps=1, default_root_dir=str(tmp_path))
        plain.fit(pytorch.TrialModule(NoisyTrial(ctx), ctx))
        plain.save_checkpoint(str(lightning_ckpt))
    with quiet_init(hparams=HPARAMS) as ctx:
        module = pytorch.TrialModule(
            NoisyTrial(ctx), ctx, latest_checkpoint=str(first.checkpoints[-1])
        )
        trainer = _trainer(max_steps=4, default_root_dir=str(tmp_path))
        with pytest.raises(pytorch.InvalidArgumentError, match="pass only one"):
            trainer.fit(module, ckpt_path=str(lightning_ckpt))


# ----- DeterminedCheckpoint -------------------------------------------------------------------


def _state(checkpoint: pathlib.Path) -> dict[str, Any]:
    return json.loads((checkpoint / "metadata.json").read_text())


def test_determined_checkpoint_writes_determined_checkpoints_at_lightnings_points(
    tmp_path: pathlib.Path,
) -> None:
    """Every 4 batches, every 2 epochs and at the end; `latest` names the newest; each loads
    with load_trial_from_checkpoint_path to the weights the module had then."""
    seen: dict[int, list[torch.Tensor]] = {}

    class Weights(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            seen[module.state.batches_trained] = [
                p.detach().clone() for p in module.trial.model.parameters()
            ]

    with quiet_init(hparams=HPARAMS, exp_conf=CONFIG) as ctx:
        trial = NoisyTrial(ctx)
        module = pytorch.TrialModule(trial, ctx)
        saver = pytorch.DeterminedCheckpoint(
            tmp_path / "ckpts", every_n_train_steps=4, every_n_epochs=2, checkpoint_policy="none"
        )
        _trainer(max_steps=13, callbacks=[Weights(), saver]).fit(module)
    written = saver.checkpoints
    assert [_state(c)["steps_completed"] for c in written] == [4, 8, 10, 12, 13]
    assert (tmp_path / "ckpts" / "latest").read_text().strip() == written[-1].name
    for checkpoint in written:
        assert {"state_dict.pth", "metadata.json", "load_data.json", "code"} <= {
            p.name for p in checkpoint.iterdir()
        }
        loaded = pytorch.load_trial_from_checkpoint_path(str(checkpoint), trial_class=NoisyTrial)
        batches = _state(checkpoint)["steps_completed"]
        for got, want in zip(loaded.model.parameters(), seen[batches], strict=True):
            assert torch.equal(got, want)


def test_determined_checkpoint_policy_and_retention(tmp_path: pathlib.Path) -> None:
    """checkpoint_policy='best' by the monitored metric, one best and one latest kept."""
    validations: list[tuple[int, float]] = []

    class Validations(pl.Callback):
        def on_validation_end(self, trainer: Any, module: Any) -> None:
            metrics = module.last_validation_metrics
            validations.append((module.state.batches_trained, float(metrics["val_loss"])))

    with quiet_init(hparams=HPARAMS, exp_conf=CONFIG) as ctx:
        module = pytorch.TrialModule(NoisyTrial(ctx), ctx)
        saver = pytorch.DeterminedCheckpoint(
            tmp_path,
            monitor="val_loss",
            checkpoint_policy="best",
            save_trial_latest=1,
            save_trial_best=1,
        )
        _trainer(max_epochs=4, callbacks=[Validations(), saver]).fit(module)
    assert [b for b, _ in validations] == [5, 10, 15, 20]
    best_batches = min(validations, key=lambda v: v[1])[0]
    kept = sorted(_state(c)["steps_completed"] for c in saver.checkpoints)
    on_disk = sorted(_state(c)["steps_completed"] for c in tmp_path.iterdir() if c.is_dir())
    assert kept == on_disk == sorted({best_batches, 20})


def test_determined_checkpoint_refuses_a_plain_lightning_module() -> None:
    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).sum()

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(pytorch.InvalidArgumentError, match="ModelCheckpoint"):
        _trainer(max_steps=1, callbacks=[pytorch.DeterminedCheckpoint()]).fit(Plain())


def test_determined_checkpoint_best_without_a_metric_is_refused(tmp_path: pathlib.Path) -> None:
    with quiet_init(hparams=HPARAMS) as ctx:
        module = pytorch.TrialModule(NoisyTrial(ctx), ctx)
        saver = pytorch.DeterminedCheckpoint(tmp_path, checkpoint_policy="best")
        with pytest.raises(pytorch.InvalidArgumentError, match="monitor="):
            _trainer(max_steps=1, callbacks=[saver]).fit(module)
    with pytest.raises(pytorch.InvalidArgumentError, match="checkpoint_policy"):
        pytorch.DeterminedCheckpoint(checkpoint_policy="sometimes")


def test_determined_checkpoint_into_an_unusable_directory_fails_before_training(
    tmp_path: pathlib.Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with quiet_init(hparams=HPARAMS) as ctx:
        module = pytorch.TrialModule(NoisyTrial(ctx), ctx)
        saver = pytorch.DeterminedCheckpoint(blocked, checkpoint_policy="none")
        with pytest.raises(pytorch.InvalidArgumentError, match="cannot take checkpoints"):
            _trainer(max_steps=2, callbacks=[saver]).fit(module)
    assert module.state.batches_trained == 0


def test_determined_checkpoint_saves_where_a_stop_request_ends_training(
    tmp_path: pathlib.Path,
) -> None:
    with quiet_init(hparams={**HPARAMS, "stop_at": 7}, exp_conf=CONFIG) as ctx:
        module = pytorch.TrialModule(NoisyTrial(ctx), ctx)
        saver = pytorch.DeterminedCheckpoint(tmp_path, checkpoint_policy="none")
        trainer = _trainer(max_steps=17, log_every_n_steps=1, callbacks=[saver])
        trainer.fit(module)
    assert trainer.should_stop
    assert [_state(c)["steps_completed"] for c in saver.checkpoints] == [7]


def test_determined_checkpoint_continues_to_the_uninterrupted_weights(
    tmp_path: pathlib.Path,
) -> None:
    """A TrialModule continues the DeterminedCheckpoint another wrote (at an epoch's end)."""
    reference, _ = _fit(None, pytorch.Batch(17))
    with quiet_init(hparams=HPARAMS, exp_conf=CONFIG) as ctx:
        saver = pytorch.DeterminedCheckpoint(tmp_path, checkpoint_policy="none")
        _trainer(max_steps=10, limit_val_batches=0, callbacks=[saver]).fit(
            pytorch.TrialModule(NoisyTrial(ctx), ctx)
        )
    trial, _ = _continue(saver.checkpoints[-1], max_steps=17)
    assert _same(trial, reference)


def test_run_resume_continues_a_determined_checkpoint_written_in_a_trainer(
    tmp_path: pathlib.Path,
) -> None:
    """`lightning-bridge run --resume` continues what DeterminedCheckpoint wrote from a
    TrialModule of the folder's trial, to the weights of an uninterrupted run."""
    whole = write_folder(tmp_path, name="whole")
    assert main(["run", str(whole)]) == 0
    want = checkpoint_weights(max(kept_checkpoints(), key=steps_completed))

    parts = write_folder(tmp_path, name="parts")
    _import_map.install()
    sys.path.insert(0, str(parts.parent))
    import model_def  # type: ignore[import-not-found]

    config = dict(BASE_CONFIG, hyperparameters={"global_batch_size": 8, "lr": 0.05})
    with quiet_init(hparams=config["hyperparameters"], exp_conf=config) as ctx:
        module = pytorch.TrialModule(model_def.LinearTrial(ctx), ctx)
        saver = pytorch.DeterminedCheckpoint(tmp_path / "ckpts")
        _trainer(max_epochs=1, callbacks=[saver]).fit(module)
    written = saver.last_checkpoint
    assert written is not None and steps_completed(written) == 8
    assert main(["run", str(parts), "--resume", str(written)]) == 0
    last = max(kept_checkpoints(), key=steps_completed)
    assert steps_completed(last) == 16
    for key, value in checkpoint_weights(last).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=0)


@pytest.mark.slow
def test_determined_checkpoint_under_ddp_writes_once_and_every_rank_learns_each_id(
    tmp_path: pathlib.Path,
) -> None:
    import os
    import subprocess

    repo = pathlib.Path(__file__).resolve().parents[1]
    ckpts = tmp_path / "ckpts"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + [str(repo / "tests" / "_trial_module_dist_script.py"), str(tmp_path / "out")]
        + [str(ckpts)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in (0, 1)]
    written = sorted(p.name for p in ckpts.iterdir() if p.is_dir())
    # A checkpoint after each of the 3 batches, each written once (by rank 0), all kept.
    assert len(written) == 3
    assert ranks[0]["uuids"] == ranks[1]["uuids"] and sorted(ranks[0]["uuids"]) == written
    assert ranks[0]["kept"] == ranks[0]["uuids"]
    assert ranks[0]["weight"] == ranks[1]["weight"]
