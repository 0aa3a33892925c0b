"""Train the unchanged DigitsTrial (model_def.py) in your own `lightning.Trainer`.

    python train.py                              # 5 epochs, one process
    torchrun --nproc_per_node=2 train.py         # Lightning's DDP, one process per rank
    python train.py --test                       # two training batches, one validation batch
    python train.py --resume latest              # continue the newest checkpoint

`lightning_bridge.TrialModule` makes the trial a LightningModule; the Trainer is an ordinary
one, with Lightning's callbacks and loggers. `lightning_bridge.DeterminedCheckpoint` writes
Determined checkpoints (to `checkpoints/`) after every epoch and where training ends, keeping
the newest and the best by `validation_loss`: `--resume` continues one exactly, and
`lightning-bridge run const.yaml --resume DIR`, `load_trial_from_checkpoint_path(DIR)` and
Determined itself read them too. Hyperparameters come from const.yaml, as in Determined's
local training mode. Under torchrun, `init()` joins the launch and the Trainer gets one device
per process.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import lightning.pytorch as pl
import yaml
from model_def import DigitsTrial

import lightning_bridge

HERE = pathlib.Path(__file__).resolve().parent


def main() -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--test", action="store_true", help="two training batches, one validation")
    parser.add_argument(
        "--resume", metavar="CHECKPOINT", help="a checkpoint directory to continue, or 'latest'"
    )
    args = parser.parse_args()

    config = yaml.safe_load((HERE / "const.yaml").read_text())
    with lightning_bridge.init(hparams=config["hyperparameters"], exp_conf=config) as ctx:
        trial = DigitsTrial(ctx)
        module = lightning_bridge.TrialModule(
            trial, ctx, test_mode=args.test, latest_checkpoint=args.resume
        )
        saver = lightning_bridge.DeterminedCheckpoint(
            every_n_epochs=1, monitor="validation_loss", save_trial_latest=1, save_trial_best=1
        )
        # searcher.max_length and min_validation_period, as Trainer arguments.
        schedule: dict[str, Any] = {
            "max_epochs": config["searcher"]["max_length"]["epochs"],
            "check_val_every_n_epoch": config["min_validation_period"]["epochs"],
        }
        if args.test:
            schedule = {"max_steps": 2, "val_check_interval": 2, "check_val_every_n_epoch": None}
        dist = ctx.distributed
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=dist.get_local_size(),
            num_nodes=dist.get_cross_size(),
            strategy="ddp" if dist.get_size() > 1 else "auto",
            callbacks=[saver],
            enable_checkpointing=False,  # DeterminedCheckpoint writes the checkpoints
            logger=False,
            enable_progress_bar=False,
            num_sanity_val_steps=0,
            **schedule,
        )
        trainer.fit(module)
    if dist.get_rank() != 0:
        return None
    metrics = module.last_validation_metrics or {}
    print(
        f"trained {module.state.batches_trained} batches on {dist.get_size()} process(es); "
        + ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(metrics.items()) if "_" in k)
    )
    print(f"checkpoints: {', '.join(str(p) for p in saver.checkpoints)}")
    return metrics


if __name__ == "__main__":
    main()
