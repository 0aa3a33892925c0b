"""Train LitClassifier on the digits with plain Lightning: the project before porting.

    python fit_lightning.py            # 10 epochs
    python fit_lightning.py --test     # one training and one validation batch (fast_dev_run)

`model_def.py`, `const.yaml` and `startup-hook.sh` are the same project ported to a Determined
trial by `lightning-bridge port`; see README.md.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
from data import DigitsDataModule
from lit_model import LitClassifier


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--epochs", type=int, default=10, help="epochs to train")
    parser.add_argument("--seed", type=int, default=0, help="seed of Python, NumPy and torch")
    parser.add_argument("--test", action="store_true", help="one training and validation batch")
    args = parser.parse_args()

    pl.seed_everything(args.seed)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        fast_dev_run=args.test,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(LitClassifier(), datamodule=DigitsDataModule())
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    for name in sorted(metrics):
        print(f"{name}: {metrics[name]:.4f}")
    return metrics


if __name__ == "__main__":
    main()
