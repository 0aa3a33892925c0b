"""A trial in a user's own `lightning.Trainer`, one process per rank: the script the
TrialModule tests start (alone, under Lightning's DDP launcher, or under torchrun).

    python tests/_trial_module_script.py OUT CONFIG_JSON

CONFIG_JSON: `strategy` (None: the Trainer's default), `devices` (None: the Trainer's default,
as under torchrun), `init_engine` (False: `init()` is not told the devices and strategy),
`hparams` (more of the trial's), `trainer` (more Trainer arguments), `ckpt_dir`
(ModelCheckpoint's folder: every 5 steps, every epoch, `last`), `ckpt_path`
(`Trainer.fit(ckpt_path=...)`). Every rank
writes OUT.RANK.json: the batches the trial trained (index, a fingerprint of its samples), where
it validated, the validation metrics and the final weights.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_bridge as pytorch
from tests._trials import LinearTrial, RegressionData, quiet_init

N_TRAIN = 96  # 12 batches of 8 per epoch
N_VAL = 32  # 4 batches of 8; 2 per rank under DDP


class ShuffledTrial(LinearTrial):
    """LinearTrial on a shuffled loader, recording each batch it trains."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.trained: list[tuple[int, float]] = []

    def build_training_data_loader(self) -> Any:
        return pytorch.DataLoader(
            RegressionData(N_TRAIN),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> Any:
        return pytorch.DataLoader(
            RegressionData(N_VAL, seed=1), batch_size=self.context.get_per_slot_batch_size()
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.trained.append((batch_idx, round(float(batch[0].sum()), 4)))
        # A stop request from one rank only (hparams `stop_at`, `stop_rank`).
        if batch_idx == self.hp.get("stop_at") and (
            self.context.distributed.rank == self.hp.get("stop_rank", 0)
        ):
            self.context.set_stop_requested(True)
        return super().train_batch(batch, epoch_idx, batch_idx)


class Validations(pl.Callback):
    """The step of every validation (Lightning's sanity check aside)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.steps.append(trainer.global_step)


def main(out: str, config: dict[str, Any]) -> None:
    engine: dict[str, Any] = {}
    if config.get("devices"):
        engine = {"accelerator": "cpu", "devices": config["devices"]}
        if config.get("strategy"):
            engine["strategy"] = config["strategy"]
    hparams = {"global_batch_size": 8, "n_train": N_TRAIN, **config.get("hparams", {})}
    with quiet_init(hparams=hparams, **(engine if config.get("init_engine", True) else {})) as ctx:
        trial = ShuffledTrial(ctx)
        validations = Validations()
        callbacks: list[Any] = [validations]
        if config.get("ckpt_dir"):
            callbacks.append(
                ModelCheckpoint(
                    dirpath=config["ckpt_dir"],
                    every_n_train_steps=config.get("every", 5),
                    save_top_k=-1,
                    save_last=True,
                )
            )
            callbacks.append(
                ModelCheckpoint(
                    dirpath=config["ckpt_dir"],
                    filename="end-of-{epoch}",
                    every_n_epochs=1,
                    save_top_k=-1,
                    save_on_train_epoch_end=True,
                )
            )
        kwargs: dict[str, Any] = {"accelerator": "cpu"}
        if config.get("devices"):
            kwargs["devices"] = config["devices"]
        if config.get("strategy"):
            kwargs["strategy"] = config["strategy"]
        trainer = pl.Trainer(
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=bool(config.get("ckpt_dir")),
            callbacks=callbacks,
            **kwargs,
            **config.get("trainer", {}),
        )
        module = pytorch.TrialModule(trial, ctx)
        trainer.fit(module, ckpt_path=config.get("ckpt_path"))
        record = {
            "rank": ctx.distributed.rank,
            "size": ctx.distributed.size,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "should_stop": trainer.should_stop,
            "stop_requested": module.stop_requested,
            "trained": trial.trained,
            "validated_at": validations.steps,
            "val_loss": [
                a["val_loss"] for n, a in trial.recorder.calls if n == "on_validation_end"
            ],
            "weights": [p.detach().flatten().tolist() for p in trial.model.parameters()],
        }
    with open(f"{out}.{record['rank']}.json", "w") as f:
        json.dump(record, f, default=float)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
