"""A small trial run by the distributed tests, one process per rank (torchrun or Lightning)."""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning_bridge as pytorch
from tests._trials import LinearTrial, quiet_init


class Trial(LinearTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        if self.hp.get("fail_rank") == self.context.distributed.rank and batch_idx == 2:
            raise RuntimeError(f"deliberate failure on rank {self.context.distributed.rank}")
        return super().train_batch(batch, epoch_idx, batch_idx)


def main(out: str, agg: int, launcher: str, fail_rank: int | None) -> None:
    engine: dict[str, Any] = {}
    if launcher == "lightning":
        engine = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
    hparams = {"global_batch_size": 8, "n_train": 64, "fail_rank": fail_rank}
    with quiet_init(hparams=hparams, aggregation_frequency=agg, **engine) as ctx:
        trial = Trial(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(12),
            validation_period=pytorch.Batch(5),
            reporting_period=pytorch.Batch(2),
        )
        record = {
            "rank": ctx.distributed.rank,
            "size": ctx.distributed.size,
            "weight": trial.model.weight.detach().flatten().tolist(),
            "bias": trial.model.bias.detach().flatten().tolist(),
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
