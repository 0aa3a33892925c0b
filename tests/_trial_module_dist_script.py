"""A TrialModule with DeterminedCheckpoint in a lightning.Trainer under torchrun (2 ranks):
each rank writes what it saw to OUT.<rank>.json. Run by tests/test_trial_module_checkpoints.py."""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import lightning.pytorch as pl

import lightning_bridge as pytorch
from tests._trials import LinearTrial, quiet_init


class Uploads(pytorch.PyTorchCallback):
    def __init__(self) -> None:
        self.uuids: list[str] = []

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        self.uuids.append(uuid)


def main(out: str, directory: str) -> None:
    with quiet_init(hparams={"global_batch_size": 16}) as ctx:
        trial = LinearTrial(ctx)
        uploads = Uploads()
        trial.build_callbacks = lambda: {"uploads": uploads}  # type: ignore[method-assign]
        module = pytorch.TrialModule(trial, ctx)
        saver = pytorch.DeterminedCheckpoint(
            directory, every_n_train_steps=1, checkpoint_policy="none"
        )
        dist = ctx.distributed
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=dist.get_local_size(),
            strategy="ddp",
            max_steps=3,
            limit_val_batches=0,
            callbacks=[saver],
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module)
        seen: dict[str, Any] = {
            "rank": dist.get_rank(),
            "uuids": uploads.uuids,
            "kept": [p.name for p in saver.checkpoints],
            "weight": trial.model.weight.detach().flatten().tolist(),
        }
    pathlib.Path(f"{out}.{seen['rank']}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
