"""Small trials for the bridge's own tests (the interop suite has the reference comparisons)."""

from __future__ import annotations

from typing import Any

import torch

import lightning_bridge as pytorch


class RegressionData(torch.utils.data.Dataset):
    """y = x . w + noise, generated from a fixed seed."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(
            n, 1, generator=g
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Recorder(pytorch.PyTorchCallback):
    """Records hook names (and a few arguments) in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.calls.append(("on_trial_startup", first_batch_idx))

    def on_trial_shutdown(self) -> None:
        self.calls.append(("on_trial_shutdown", None))

    def on_training_start(self) -> None:
        self.calls.append(("on_training_start", None))

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.calls.append(("on_training_epoch_start", epoch_idx))

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.calls.append(("on_training_epoch_end", epoch_idx))

    def on_training_workload_end(self, avg_metrics: dict, batch_metrics: list) -> None:
        self.calls.append(("on_training_workload_end", (dict(avg_metrics), len(batch_metrics))))

    def on_validation_start(self) -> None:
        self.calls.append(("on_validation_start", None))

    def on_validation_end(self, metrics: dict) -> None:
        self.calls.append(("on_validation_end", dict(metrics)))

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        self.calls.append(("on_checkpoint_write_end", checkpoint_dir))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class LinearTrial(pytorch.PyTorchTrial):
    """One linear model, SGD; knobs for the error tests through hparams."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.hp = context.get_hparams()
        torch.manual_seed(0)
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=self.hp.get("lr", 0.05))
        )
        self.recorder = Recorder()
        self.n_train = int(self.hp.get("n_train", 32))
        self.n_val = int(self.hp.get("n_val", 16))

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"recorder": self.recorder}

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(
            RegressionData(self.n_train), batch_size=self.context.get_per_slot_batch_size()
        )

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(RegressionData(self.n_val, seed=1), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}


def quiet_init(**kwargs: Any) -> Any:
    """`lightning_bridge.init` without progress bars or model summaries (test output)."""
    trainer_kwargs = {"enable_progress_bar": False, "enable_model_summary": False}
    trainer_kwargs.update(kwargs.pop("trainer_kwargs", {}))
    kwargs.setdefault("hparams", {"global_batch_size": 8})
    return pytorch.init(trainer_kwargs=trainer_kwargs, **kwargs)


def fit(trial_cls: type = LinearTrial, init_kwargs: dict | None = None, **fit_kwargs: Any) -> Any:
    """Build and fit a trial; returns (trial, trainer)."""
    with quiet_init(**(init_kwargs or {})) as ctx:
        trial = trial_cls(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        trainer.fit(**fit_kwargs)
    return trial, trainer
