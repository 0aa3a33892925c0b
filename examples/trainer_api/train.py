"""A breast-cancer classifier trained with Determined's Trainer API.

    lightning-bridge run const.yaml          # as an experiment: hparams from the runner
    python train.py                          # local mode: one process, hparams from const.yaml
    torchrun --nproc_per_node=2 train.py     # local mode, two processes
    python train.py --test                   # test mode: one training and one validation batch

The script follows Determined's documented pattern, `with pytorch.init(...) as ctx:
pytorch.Trainer(MyTrial(ctx), ctx).fit(...)`, and runs unchanged on a Determined cluster. With
cluster information (`det.get_cluster_info()`: `lightning-bridge run`, or a Determined
experiment) the hyperparameters and the checkpoint to continue from come from it; without it
(local mode) the script reads `const.yaml` next to itself, as Determined's local-training
documentation shows. Under `torchrun` it creates the process group and hands it to `init()`.

The data is scikit-learn's Wisconsin breast cancer set (569 tumours, 30 features, malignant or
benign), bundled with scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import random
from typing import Any

import numpy as np
import torch
import yaml
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn

try:
    import determined as det
    from determined import pytorch
except ImportError:
    # Determined is not installed: train with the bridge, which stands in for
    # `determined.pytorch`. There is no cluster then, so the script runs in local mode.
    import lightning_bridge as pytorch

    det = None

HERE = pathlib.Path(__file__).resolve().parent
# The train / validation split is fixed, whatever the trial seed.
SPLIT_SEED = 0
VALIDATION_FRACTION = 0.2


def cancer_datasets() -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """The 569 samples split 80/20 (classes balanced), standardised with the training split."""
    data = load_breast_cancer()
    features = data.data.astype(np.float32)
    labels = data.target.astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(
        features,
        labels,
        test_size=VALIDATION_FRACTION,
        random_state=SPLIT_SEED,
        stratify=labels,
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    x_train, x_val = (x_train - mean) / std, (x_val - mean) / std

    def dataset(x: np.ndarray, y: np.ndarray) -> torch.utils.data.Dataset:
        return torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    return dataset(x_train, y_train), dataset(x_val, y_val)


def exact_accuracy(counts: list[tuple[int, int]]) -> float:
    """Correct predictions over samples, from every validation batch of every process."""
    correct = sum(c for c, _ in counts)
    total = sum(n for _, n in counts)
    return correct / total if total else 0.0


class ValidationHistory(pytorch.PyTorchCallback):
    """Keeps the metrics of every validation, for the script to print at the end."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, float]] = []

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.metrics.append({name: float(value) for name, value in metrics.items()})


class CancerTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.train_data, self.val_data = cancer_datasets()
        hidden = int(context.get_hparam("hidden_size"))
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Linear(30, hidden),
                nn.ReLU(),
                nn.Dropout(float(context.get_hparam("dropout"))),
                nn.Linear(hidden, 1),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.AdamW(
                self.model.parameters(),
                lr=float(context.get_hparam("learning_rate")),
                weight_decay=float(context.get_hparam("weight_decay")),
            )
        )
        self.loss_fn = nn.BCEWithLogitsLoss()
        # A function reducer: each batch contributes (correct, count), the function sees all of
        # them, so the accuracy is exact whatever the batch sizes and the number of processes.
        self.accuracy = context.wrap_reducer(
            exact_accuracy, name="validation_accuracy", for_training=False
        )
        self.validations = ValidationHistory()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            self.train_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            self.val_data, batch_size=self.context.get_per_slot_batch_size(), shuffle=False
        )

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"validations": self.validations}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, torch.Tensor]:
        features, labels = batch
        logits = self.model(features).squeeze(1)
        loss = self.loss_fn(logits, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        accuracy = ((logits > 0).float() == labels).float().mean()
        return {"loss": loss, "train_accuracy": accuracy}

    def evaluate_batch(self, batch: Any) -> dict[str, torch.Tensor]:
        features, labels = batch
        logits = self.model(features).squeeze(1)
        correct = int(((logits > 0).float() == labels).sum())
        self.accuracy.update((correct, int(labels.numel())))
        return {"validation_loss": self.loss_fn(logits, labels)}


def train_unit(length: dict[str, int]) -> pytorch.TrainUnit:
    """A length of the experiment config (`{"epochs": 3}` or `{"batches": 100}`) as a unit."""
    if set(length) == {"epochs"}:
        return pytorch.Epoch(int(length["epochs"]))
    if set(length) == {"batches"}:
        return pytorch.Batch(int(length["batches"]))
    raise ValueError(f"expected a length such as {{'epochs': 3}} or {{'batches': 100}}: {length}")


def torch_distributed_context() -> Any:
    """Local mode under torchrun: create the process group, as Determined's docs show."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.distributed.init_process_group(backend=backend)
    os.environ["USE_TORCH_DISTRIBUTED"] = "true"
    core = det.core if det is not None else pytorch
    return core.DistributedContext.from_torch_distributed()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--config", type=pathlib.Path, default=HERE / "const.yaml", help="config in local mode"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs to train (default: searcher.max_length)"
    )
    parser.add_argument(
        "--test", action="store_true", help="test mode: train and validate one batch"
    )
    return parser.parse_args()


def main() -> dict[str, Any]:
    args = parse_args()
    info = det.get_cluster_info() if det is not None else None
    if info is None:
        # Local mode: the experiment config is read here, the seed set here.
        config: dict[str, Any] | None = yaml.safe_load(args.config.read_text())
        assert config is not None
        hparams = config["hyperparameters"]
        seed = int((config.get("reproducibility") or {}).get("experiment_seed", 0))
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
        distributed = torch_distributed_context() if launched else None
        latest_checkpoint = None
    else:
        # An experiment: the runner (or Determined) seeds, sets up the processes and has the
        # config; a restarted trial continues from its latest checkpoint.
        config = None
        hparams = info.trial.hparams
        distributed = None
        latest_checkpoint = info.latest_checkpoint

    with pytorch.init(hparams=hparams, exp_conf=config, distributed=distributed) as context:
        exp_conf = context.get_experiment_config()
        if args.epochs is not None:
            max_length = pytorch.Epoch(args.epochs)
        else:
            max_length = train_unit(exp_conf["searcher"]["max_length"])
        trial = CancerTrial(context)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=max_length,
            validation_period=train_unit(exp_conf["min_validation_period"]),
            checkpoint_period=train_unit(exp_conf["min_checkpoint_period"]),
            # Checkpoints at min_checkpoint_period and at the end only, not after every
            # validation ("all") nor after each new best ("best").
            checkpoint_policy="none",
            latest_checkpoint=latest_checkpoint,
            test_mode=args.test,
        )
        rank = context.distributed.get_rank()

    history = trial.validations.metrics
    if rank == 0:
        print("validation  validation_loss  validation_accuracy")
        for i, metrics in enumerate(history, start=1):
            print(
                f"{i:10d}  {metrics['validation_loss']:15.4f}  "
                f"{metrics['validation_accuracy']:19.4f}"
            )
    return history[-1] if history else {}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
