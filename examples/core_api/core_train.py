"""A Core API training script: Determined's `det.core.init()` with the script's own loop.

It trains a small regression model on made-up data (nothing is downloaded), and uses the Core
API as on a Determined cluster:
- hyperparameters and the checkpoint to continue from come from `det.get_cluster_info()`;
- training and validation metrics go to `core_context.train` (the record, TensorBoard);
- a checkpoint is stored every `checkpoint_every` batches with `checkpoint.store_path`, each
  process writing its own shard with several processes (`shard=True`);
- `core_context.preempt.should_preempt()` after each checkpoint: `experiment pause` (or a
  search stopping the trial) ends the loop there, and `experiment continue` picks it up;
- with several processes (`determined.launch.torch_distributed` in the entrypoint) gradients are
  averaged across them with torch.distributed.
"""

import logging
import os

import determined as det
import torch
import torch.distributed as dist
from determined import core


def made_up_data(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] - x[:, 2:3] ** 2
    return x, y


def main(core_context: core.Context, info: det.ClusterInfo) -> None:
    hp = info.trial.hparams
    d = core_context.distributed
    torch.manual_seed(info.trial.trial_seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, hp["hidden"]), torch.nn.ReLU(), torch.nn.Linear(hp["hidden"], 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=hp["lr"])
    start = 0
    if info.latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = torch.load(path / "state.pt")
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["batches"]
    x, y = made_up_data()
    batch_size = hp["batch_size"]
    batches = hp["batches"]
    for batch in range(start, batches):
        rows = torch.arange(batch * batch_size, (batch + 1) * batch_size) % len(x)
        rows = rows[d.rank :: d.size]  # this process's share of the batch
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        if d.size > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= d.size
        opt.step()
        done = batch + 1
        if done % hp["checkpoint_every"] == 0 or done == batches:
            with torch.no_grad():
                val_loss = float(torch.nn.functional.mse_loss(model(x), y))
            if d.rank == 0:
                core_context.train.report_training_metrics(
                    steps_completed=done, metrics={"loss": float(loss)}
                )
                core_context.train.report_validation_metrics(
                    steps_completed=done, metrics={"val_loss": val_loss, "batches": done}
                )
            with core_context.checkpoint.store_path(
                {"steps_completed": done}, shard=d.size > 1
            ) as (path, _):
                if d.rank == 0:
                    torch.save(
                        {"model": model.state_dict(), "opt": opt.state_dict(), "batches": done},
                        path / "state.pt",
                    )
            if core_context.preempt.should_preempt():
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "run it with: lightning-bridge run const.yaml"
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        distributed = core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, info)
