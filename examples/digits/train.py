"""Train the digits classifier with the Trainer API.

    python train.py              # the full run (searcher.max_length epochs of const.yaml)
    python train.py --epochs 3   # a shorter run
    python train.py --test       # one training batch and one validation batch

Hyperparameters and the seed come from const.yaml, the experiment config of this trial.
Logs and checkpoints are written under the working directory.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import random
from typing import Any

import numpy as np
import torch
import yaml
from model_def import DigitsTrial, pytorch

HERE = pathlib.Path(__file__).resolve().parent


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch, as Determined does for a trial on a cluster."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--config", type=pathlib.Path, default=HERE / "const.yaml", help="experiment config"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs to train (default: from the config)"
    )
    parser.add_argument(
        "--test", action="store_true", help="test mode: train and validate one batch"
    )
    return parser.parse_args()


def main() -> dict[str, Any]:
    args = parse_args()
    config = yaml.safe_load(args.config.read_text())
    epochs = args.epochs if args.epochs is not None else config["searcher"]["max_length"]["epochs"]
    seed = int((config.get("reproducibility") or {}).get("experiment_seed", 0))

    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config) as context:
        seed_everything(seed)
        trial = DigitsTrial(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=pytorch.Epoch(epochs),
            validation_period=pytorch.Epoch(1),
            checkpoint_period=pytorch.Epoch(epochs),
            checkpoint_policy="none",
            test_mode=args.test,
        )

    metrics = trial.latest_validation.metrics
    print("last validation metrics:")
    for name in sorted(metrics):
        print(f"  {name}: {float(metrics[name]):.4f}")
    return metrics


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
