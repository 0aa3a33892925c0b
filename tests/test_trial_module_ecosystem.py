"""Lightning's ecosystem around a TrialModule: callbacks, loggers, precisions, compiled models,
`Trainer.validate` / `test` / `predict`. Each works on the trial or is refused with one message
(docs/trialmodule.md lists them).

The names: Lightning's callbacks (`EarlyStopping`, `ModelCheckpoint`) and the progress bar see
training metrics as `<name>` and validation metrics as `val_<name>`; loggers get every batch's
training metrics as `Determined/<name>` and validations as `Determined/val_<name>`, at the
trial's batch count (Determined's TensorBoard tags).
"""

from __future__ import annotations

import csv
import pathlib
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import lightning_bridge as pytorch
from tests._trials import LinearTrial, Recorder, quiet_init

# LinearTrial: 32 records, 8 a batch: 4 batches an epoch.


def _trainer(**kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs
    )


class Losses(LinearTrial):
    """Records each batch's loss and the dtype the model's forward returned."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.losses: list[float] = []
        self.dtypes: set[torch.dtype] = set()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        out = self.model(x)
        self.dtypes.add(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y.float())
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        self.losses.append(float(loss))
        return {"loss": loss}


class Validations(pl.Callback):
    """The trial's validations as the module reports them: (batches trained, metrics)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if not trainer.sanity_checking:
            self.seen.append((module.state.batches_trained, dict(module.last_validation_metrics)))


def _csv_rows(log_dir: str) -> list[dict[str, str]]:
    with open(pathlib.Path(log_dir) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    return {int(r["step"]): float(r[name]) for r in rows if r.get(name)}


# ----- callbacks ------------------------------------------------------------------------------


def test_early_stopping_stops_on_the_trials_validation_metric() -> None:
    with quiet_init() as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        validations = Validations()
        stopper = pl.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)
        trainer = _trainer(max_epochs=6, callbacks=[validations, stopper])
        trainer.fit(module)
    # The loss falls by less than min_delta: the second validation stops the fit.
    assert [b for b, _ in validations.seen] == [4, 8]
    assert module.state.batches_trained == 8
    assert float(stopper.best_score) == pytest.approx(float(validations.seen[0][1]["val_loss"]))


def test_model_checkpoint_keeps_the_best_validation_of_the_trial(tmp_path: pathlib.Path) -> None:
    with quiet_init(hparams={"global_batch_size": 8, "lr": 0.3}) as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        validations = Validations()
        saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
        _trainer(max_epochs=4, enable_checkpointing=True, callbacks=[validations, saver]).fit(
            module
        )
    batches, best = min(validations.seen, key=lambda v: float(v[1]["val_loss"]))
    assert float(saver.best_model_score) == pytest.approx(float(best["val_loss"]))
    saved = torch.load(saver.best_model_path, weights_only=False)
    assert saved["lightning_bridge"]["trial_state"]["batches_trained"] == batches


def test_learning_rate_monitor_logs_the_rates_the_trials_scheduler_sets(
    tmp_path: pathlib.Path,
) -> None:
    class Scheduled(LinearTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            super().__init__(context)
            context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5),
                pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH,
            )

    with quiet_init(hparams={"global_batch_size": 8, "lr": 0.08}) as ctx:
        module = pytorch.TrialModule(Scheduled(ctx), ctx)
        logger = pl.loggers.CSVLogger(tmp_path, name="", version="")
        monitor = pl.callbacks.LearningRateMonitor(logging_interval="step")
        trainer = _trainer(max_steps=5, logger=logger, log_every_n_steps=1, callbacks=[monitor])
        trainer.fit(module)
    rates = _column(_csv_rows(logger.log_dir), "lr-SGD")
    assert rates == {step: pytest.approx(0.08 * 0.5**step) for step in range(5)}
    # The trial's context steps its schedulers: Lightning's own list stays empty.
    assert module.lr_schedulers() is None


def test_stochastic_weight_averaging_is_refused_with_one_message() -> None:
    with quiet_init() as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        swa = pl.callbacks.StochasticWeightAveraging(swa_lrs=0.01)
        with pytest.raises(pytorch.InvalidArgumentError, match="StochasticWeightAveraging"):
            _trainer(max_epochs=2, callbacks=[swa]).fit(module)
        assert module.state.batches_trained == 0


# ----- loggers --------------------------------------------------------------------------------


def _fit_logged(logger: Any) -> tuple[Losses, Validations]:
    with quiet_init() as ctx:
        trial = Losses(ctx)
        module = pytorch.TrialModule(trial, ctx)
        validations = Validations()
        _trainer(max_epochs=2, logger=logger, log_every_n_steps=2, callbacks=[validations]).fit(
            module
        )
    return trial, validations


def test_csv_logger_gets_every_batchs_training_and_each_validations_metrics(
    tmp_path: pathlib.Path,
) -> None:
    logger = pl.loggers.CSVLogger(tmp_path, name="", version="")
    trial, validations = _fit_logged(logger)
    rows = _csv_rows(logger.log_dir)
    assert _column(rows, "Determined/loss") == {
        i: pytest.approx(loss) for i, loss in enumerate(trial.losses)
    }
    assert _column(rows, "Determined/val_loss") == {
        batches: pytest.approx(float(m["val_loss"])) for batches, m in validations.seen
    }


def test_tensorboard_logger_gets_the_trials_metrics(tmp_path: pathlib.Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = pl.loggers.TensorBoardLogger(tmp_path, name="", version="")
    trial, validations = _fit_logged(logger)
    (events,) = pathlib.Path(logger.log_dir).glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    losses = {e.step: e.value for e in acc.Scalars("Determined/loss")}
    assert losses == {i: pytest.approx(loss) for i, loss in enumerate(trial.losses)}
    val = {e.step: e.value for e in acc.Scalars("Determined/val_loss")}
    assert val == {b: pytest.approx(float(m["val_loss"])) for b, m in validations.seen}


@pytest.mark.mlflow
def test_mlflow_logger_gets_the_trials_metrics(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = pl.loggers.MLFlowLogger(experiment_name="trial", tracking_uri=uri)
    trial, validations = _fit_logged(logger)
    client = MlflowClient(tracking_uri=uri)
    losses = {m.step: m.value for m in client.get_metric_history(logger.run_id, "Determined/loss")}
    assert losses == {i: pytest.approx(loss) for i, loss in enumerate(trial.losses)}
    val = client.get_metric_history(logger.run_id, "Determined/val_loss")
    assert {m.step: m.value for m in val} == {
        b: pytest.approx(float(m["val_loss"])) for b, m in validations.seen
    }


# ----- Trainer.validate / test / predict ------------------------------------------------------


def test_validate_runs_the_trials_validation_on_its_data_and_on_other_data() -> None:
    with quiet_init() as ctx:
        trial = LinearTrial(ctx)
        module = pytorch.TrialModule(trial, ctx)
        (results,) = _trainer().validate(module, verbose=False)
        with torch.no_grad():
            x, y = trial.build_validation_data_loader().dataset[:]
            expected = float(torch.nn.functional.mse_loss(trial.model(x), y))
        assert results == {"val_loss": pytest.approx(expected)}
        assert trial.recorder.names().count("on_validation_end") == 1
        # Other data: the trial's evaluate_batch over the loader given.
        other = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x[:8] * 2, y[:8]), batch_size=8
        )
        (results,) = _trainer().validate(module, dataloaders=other, verbose=False)
        with torch.no_grad():
            expected = float(torch.nn.functional.mse_loss(trial.model(x[:8] * 2), y[:8]))
        assert results == {"val_loss": pytest.approx(expected)}


def test_validate_a_module_given_a_checkpoint_validates_the_checkpoints_weights() -> None:
    with quiet_init() as ctx:
        trial = LinearTrial(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(max_length=pytorch.Batch(6))
        fitted = float(trainer.last_validation_metrics["val_loss"])
    with quiet_init() as ctx:
        module = pytorch.TrialModule(
            LinearTrial(ctx), ctx, latest_checkpoint=str(trainer.checkpoints[-1])
        )
        (results,) = _trainer().validate(module, verbose=False)
    assert results == {"val_loss": pytest.approx(fitted)}


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (lambda t, m: t.test(m), "Trainer.test\\(module\\): a PyTorchTrial has no test step"),
        (lambda t, m: t.predict(m), "Trainer.predict\\(module\\): a PyTorchTrial defines no"),
    ],
    ids=["test", "predict"],
)
def test_test_and_predict_are_refused_with_what_to_do_instead(run: Any, message: str) -> None:
    with quiet_init() as ctx:
        module = pytorch.TrialModule(LinearTrial(ctx), ctx)
        with pytest.raises(pytorch.InvalidArgumentError, match=message):
            run(_trainer(), module)


# ----- precision and compiled models ----------------------------------------------------------


def test_bf16_mixed_runs_the_trial_under_autocast() -> None:
    with quiet_init() as ctx:
        trial = Losses(ctx)
        module = pytorch.TrialModule(trial, ctx)
        _trainer(max_steps=4, precision="bf16-mixed").fit(module)
    assert trial.dtypes == {torch.bfloat16}
    assert trial.model.weight.dtype == torch.float32  # master weights stay in float32
    assert len(trial.losses) == 4 and all(torch.isfinite(torch.tensor(trial.losses)))


def test_16_mixed_on_the_cpu_is_lightnings_bf16_with_its_warning() -> None:
    """Lightning itself (accelerator_connector.py) runs '16-mixed' on the CPU as 'bf16-mixed'
    and says so; on a GPU it is float16 autocast with a gradient scaler."""
    with quiet_init() as ctx:
        trial = Losses(ctx)
        module = pytorch.TrialModule(trial, ctx)
        with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU"):
            trainer = _trainer(max_steps=4, precision="16-mixed", accelerator="cpu")
        trainer.fit(module)
    assert trial.dtypes == {torch.bfloat16}
    assert len(trial.losses) == 4 and all(torch.isfinite(torch.tensor(trial.losses)))


def test_double_precision_trains_the_trial_in_float64() -> None:
    with quiet_init() as ctx:
        trial = Losses(ctx)
        module = pytorch.TrialModule(trial, ctx)
        _trainer(max_steps=2, precision="64-true").fit(module)
    assert trial.dtypes == {torch.float64}
    assert trial.model.weight.dtype == torch.float64


# Lightning sees the same compiled module (torch's OptimizedModule) whichever backend compiles
# it: the older minors run the eager one, the latest torch.compile's default too (inductor,
# which builds C++ for a minute on a busy machine).
@pytest.mark.parametrize(
    "backend", [pytest.param("inductor", marks=pytest.mark.latest_lightning), "eager"]
)
def test_a_compiled_model_in_the_trial_trains_as_the_plain_one(backend: str) -> None:
    class Compiled(LinearTrial):
        """LinearTrial with `context.wrap_model(torch.compile(model))`."""

        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.hp = context.get_hparams()
            torch.manual_seed(0)
            compiled = torch.compile(torch.nn.Linear(4, 1), backend=backend)
            self.model = context.wrap_model(compiled)
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))
            self.recorder = Recorder()
            self.n_train, self.n_val = 32, 16

    with quiet_init() as ctx:
        compiled = Compiled(ctx)
        _trainer(max_steps=6).fit(pytorch.TrialModule(compiled, ctx))
    with quiet_init() as ctx:
        plain = LinearTrial(ctx)
        _trainer(max_steps=6).fit(pytorch.TrialModule(plain, ctx))
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    weight = compiled.model._orig_mod.weight
    assert not torch.equal(weight, torch.nn.Linear(4, 1).weight)  # it trained
    torch.testing.assert_close(weight, plain.model.weight, rtol=0, atol=1e-6)
