"""A small trial run by the distributed tests, one process per rank (torchrun or Lightning)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

import lightning_bridge as pytorch
from tests._trials import LinearTrial, quiet_init


class Trial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        d = context.distributed
        self.seen_at_init = [d.get_rank(), d.get_size(), d.get_local_rank(), d.get_local_size()]
        self.seen_at_init += [d.get_cross_rank(), d.get_cross_size()]

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if self.hp.get("fail_rank") == self.context.distributed.rank and batch_idx == 2:
            raise RuntimeError(f"deliberate failure on rank {self.context.distributed.rank}")
        return super().train_batch(batch, epoch_idx, batch_idx)


class TwoModelTrial(Trial):
    """Two models stepped separately, GAN style: each loss leaves the other model's
    parameters without gradients (the second model learns the first's detached output)."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        torch.manual_seed(1)
        self.follower = context.wrap_model(torch.nn.Linear(4, 1))
        self.follower_opt = context.wrap_optimizer(
            torch.optim.SGD(self.follower.parameters(), lr=0.1)
        )

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        x, y = batch
        prediction = self.model(x)
        loss = torch.nn.functional.mse_loss(prediction, y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        follow = torch.nn.functional.mse_loss(self.follower(x), prediction.detach())
        self.context.backward(follow)
        self.context.step_optimizer(self.follower_opt)
        return {"loss": loss, "follow": follow}


def main(out: str, agg: int, launcher: str, fail_rank: int | None) -> None:
    engine: dict[str, Any] = {}
    if launcher == "lightning":
        engine = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
    hparams = {"global_batch_size": 8, "n_train": 64, "fail_rank": fail_rank}
    with quiet_init(hparams=hparams, aggregation_frequency=agg, **engine) as ctx:
        two_models = os.environ.get("BRIDGE_TEST_TRIAL") == "two_models"
        trial = TwoModelTrial(ctx) if two_models else Trial(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(12),
            validation_period=pytorch.Batch(5),
            reporting_period=pytorch.Batch(2),
        )
        record = {
            "rank": ctx.distributed.rank,
            "size": ctx.distributed.size,
            "seen_at_init": trial.seen_at_init,
            "weight": trial.model.weight.detach().flatten().tolist(),
            "bias": trial.model.bias.detach().flatten().tolist(),
            "follower": [p.detach().flatten().tolist() for p in trial.follower.parameters()]
            if isinstance(trial, TwoModelTrial)
            else [],
            "calls": [
                (n, a if n == "on_training_workload_end" else None)
                for n, a in (
                    (n, a) for n, a in trial.recorder.calls if n != "on_checkpoint_write_end"
                )
            ],
            "val": [a for n, a in trial.recorder.calls if n == "on_validation_end"],
        }
    with open(f"{out}.{record['rank']}.json", "w") as f:
        json.dump(record, f, default=float)


if __name__ == "__main__":
    fail = sys.argv[4] if len(sys.argv) > 4 else ""
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(fail) if fail else None)
