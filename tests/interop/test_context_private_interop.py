"""Determined's private context attributes that trials read answer as on determined==0.38.1.

Trials read some of Determined's private context state: its AMP test fixture reads
`context._aggregation_frequency` and replaces `context._scaler`, its examples and model_hub
read `context._epoch_len` and `context._current_batch_idx`. Every name the bridge keeps
(`DETERMINED_PRIVATE_NAMES`) is read by the same trial on both sides, at the same points of
the same fit, and compared; the fixture's AMP trials train to the same per-batch values.
"""

from __future__ import annotations

import pathlib
from types import ModuleType
from typing import Any

import pytest
import torch

from lightning_bridge.contract._determined_private import DETERMINED_PRIVATE_NAMES

from .compare import diff_values, format_report
from .harness import isolated_environment, seed_everything
from .onevar_amp import STAGES, make_onevar_amp_trials

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
bridge: ModuleType = pytest.importorskip("lightning_bridge")


def _read(context: Any, dotted: str) -> Any:
    value = context
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _make_reading_trial(pytorch: ModuleType) -> type:
    class ReadingTrial(pytorch.PyTorchTrial):
        """Reads every kept private name at each point of the fit a trial can run code."""

        def __init__(self, context: Any) -> None:
            self.context = context
            self.readings: list[tuple[str, dict[str, Any]]] = []
            self.model = context.wrap_model(torch.nn.Linear(2, 1))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), 0.1))
            self.read("__init__")

        def read(self, where: str) -> None:
            values = {name: _read(self.context, name) for name in DETERMINED_PRIVATE_NAMES}
            self.readings.append((where, values))

        def build_callbacks(self) -> dict[str, Any]:
            trial = self

            class Reader(pytorch.PyTorchCallback):  # type: ignore[name-defined]
                def on_training_start(self) -> None:
                    trial.read("on_training_start")

                def on_training_epoch_start(self, epoch_idx: int) -> None:
                    trial.read(f"on_training_epoch_start({epoch_idx})")

                def on_validation_end(self, metrics: dict[str, Any]) -> None:
                    trial.read("on_validation_end")

            return {"reader": Reader()}

        def build_training_data_loader(self) -> Any:
            self.read("build_training_data_loader")
            x = torch.arange(40, dtype=torch.float32).reshape(20, 2) / 40
            data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
            return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

        def build_validation_data_loader(self) -> Any:
            self.read("build_validation_data_loader")
            x = torch.ones(8, 2)
            data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
            return pytorch.DataLoader(data, batch_size=4)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            self.read(f"train_batch({batch_idx})")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            self.read("evaluate_batch")
            x, y = batch
            return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}

    return ReadingTrial


def _init_kwargs(pytorch: ModuleType, **kwargs: Any) -> dict[str, Any]:
    if pytorch is bridge:
        kwargs |= {
            "accelerator": "cpu",
            "checkpoint_dir": pathlib.Path("bridge_checkpoints").resolve(),
            "trainer_kwargs": {"enable_progress_bar": False, "enable_model_summary": False},
        }
    return kwargs


def _readings(pytorch: ModuleType, workdir: pathlib.Path) -> list[tuple[str, dict[str, Any]]]:
    with isolated_environment(workdir):
        seed_everything(3)
        with pytorch.init(
            hparams={"global_batch_size": 4, "lr": 0.1},
            exp_conf={"name": "private-names", "data": {"records": 20}},
            **_init_kwargs(pytorch, aggregation_frequency=2, enable_tensorboard_logging=False),
        ) as context:
            trial = _make_reading_trial(pytorch)(context)
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(8),
                validation_period=pytorch.Batch(6),
                checkpoint_policy="none",
            )
    return trial.readings


def test_the_kept_private_names_read_as_on_determined(tmp_path: pathlib.Path) -> None:
    expected = _readings(reference, tmp_path / "reference")
    got = _readings(bridge, tmp_path / "bridge")
    assert [where for where, _ in got] == [where for where, _ in expected]
    by_point = dict(got)
    # The values the fixture and the examples read, as Determined has them (the comparison
    # below checks every name; these say what it means).
    assert by_point["__init__"]["_aggregation_frequency"] == 2
    assert by_point["build_training_data_loader"]["_epoch_len"] is None
    assert by_point["train_batch(5)"]["_epoch_len"] == 5
    assert by_point["train_batch(5)"]["_current_batch_idx"] == 5
    assert by_point["__init__"]["_current_batch_idx"] is None
    lines = []
    for (where, want), (_, have) in zip(expected, got, strict=True):
        for name in DETERMINED_PRIVATE_NAMES:
            a, b = want[name], have[name]
            if isinstance(a, (int, float, str, bool, dict, list)) or a is None:
                lines += diff_values(a, b, f"{where}: context.{name}")
            elif type(a) is not type(b):
                lines.append(f"{where}: context.{name} is a {type(b)}, not a {type(a)}")
    assert not lines, format_report("private context attributes differ", lines)


def test_a_private_name_the_bridge_does_not_keep_says_what_to_use() -> None:
    with bridge.init(hparams={"global_batch_size": 4}, accelerator="cpu") as context:
        with pytest.raises(AttributeError, match=r"context\._core .*Core API"):
            context._core  # noqa: B018
        with pytest.raises(AttributeError, match=r"context\._num_gpus .*context\.device"):
            context._num_gpus  # noqa: B018
        with pytest.raises(bridge.InvalidTrialError, match="aggregation_frequency"):
            context._aggregation_frequency = 4
        assert not hasattr(context, "_no_such_name")


def _onevar_rows(
    pytorch: ModuleType, kind: str, agg: int, workdir: pathlib.Path
) -> tuple[list[dict[str, Any]], Any]:
    with isolated_environment(workdir):
        seed_everything(0)
        with pytorch.init(
            hparams={"global_batch_size": 1},
            **_init_kwargs(pytorch, aggregation_frequency=agg, enable_tensorboard_logging=False),
        ) as context:
            trial = make_onevar_amp_trials(pytorch)[kind](context)
            assert trial.scaler is context._scaler
            pytorch.Trainer(trial, context).fit(
                max_length=pytorch.Batch(len(STAGES) * agg), checkpoint_policy="none"
            )
    return trial.rows, trial.model.weight.detach().clone()


@pytest.mark.parametrize("agg", [1, 2])
@pytest.mark.parametrize("kind", ["auto", "manual"])
def test_determineds_onevar_amp_fixture_trains_as_on_determined(
    tmp_path: pathlib.Path, kind: str, agg: int
) -> None:
    """The fixture's AMP trials (which read `context._aggregation_frequency` and, for automatic
    AMP, replace `context._scaler`) build and train batch for batch as on Determined."""
    expected, w_expected = _onevar_rows(reference, kind, agg, tmp_path / "reference")
    got, w_got = _onevar_rows(bridge, kind, agg, tmp_path / "bridge")
    assert len(got) == len(STAGES) * agg
    assert [r["stage"] for r in got][::agg] == STAGES
    assert not (lines := diff_values(expected, got, "train_batch")), format_report(
        f"[{kind}, aggregation_frequency={agg}] per-batch values differ", lines
    )
    torch.testing.assert_close(w_got, w_expected, rtol=0, atol=1e-6)
