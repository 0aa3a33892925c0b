"""Two-process DDP throughput: lightning_bridge against a plain Lightning DDP module.

Both variants train the same compute-bound MLP with the same per-process batch on two CPU
processes (gloo), launched with torchrun, in interleaved rounds. Throughput is measured inside
the training step between a warm-up batch and the last batch, so start-up is excluded.
Target: bridge / plain Lightning >= 0.98.

    python bench/ddp.py [--batches 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

DIMS = (512, 2048, 2048, 512)
PER_PROCESS_BATCH = 32
WARMUP = 20


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for i, (a, b) in enumerate(zip(DIMS, DIMS[1:], strict=False)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(DIMS) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _data(n_batches: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    n = n_batches * PER_PROCESS_BATCH * 2
    return torch.utils.data.TensorDataset(
        torch.randn(n, DIMS[0], generator=g), torch.randn(n, DIMS[-1], generator=g)
    )


class _Clock:
    """Wall time between the warm-up batch and the last batch."""

    def __init__(self, last: int) -> None:
        self.last = last
        self.start = 0.0
        self.end = 0.0

    def tick(self, batch_idx: int) -> None:
        if batch_idx == WARMUP:
            self.start = time.perf_counter()
        if batch_idx == self.last:
            self.end = time.perf_counter()


def _run_lightning(batches: int, clock: _Clock) -> None:
    import lightning.pytorch as pl
    import torch

    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = _model()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            sampler = torch.utils.data.DistributedSampler(_data(batches), shuffle=False)
            return torch.utils.data.DataLoader(
                _data(batches), batch_size=PER_PROCESS_BATCH, sampler=sampler
            )

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.manual_backward(loss)
            opt.step()  # type: ignore[union-attr]
            opt.zero_grad()  # type: ignore[union-attr]
            clock.tick(batch_idx)

    pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_steps=batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    ).fit(Plain())


def _run_bridge(batches: int, clock: _Clock, workdir: str) -> None:
    import torch

    import lightning_bridge as pytorch

    class Trial(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.net = context.wrap_model(_model())
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.net.parameters(), lr=0.01))

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(
                _data(batches), batch_size=self.context.get_per_slot_batch_size()
            )

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(_data(1), batch_size=self.context.get_per_slot_batch_size())

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            clock.tick(batch_idx)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            return {"val_loss": torch.nn.functional.mse_loss(self.net(x), y)}

    with pytorch.init(
        hparams={"global_batch_size": PER_PROCESS_BATCH * 2},
        enable_tensorboard_logging=False,
        accelerator="cpu",
        run_dir=workdir,
        trainer_kwargs={"enable_progress_bar": False, "enable_model_summary": False},
    ) as ctx:
        pytorch.Trainer(Trial(ctx), ctx).fit(
            max_length=pytorch.Batch(batches), reporting_period=pytorch.Batch(100)
        )


def _worker(variant: str, batches: int, result: str) -> None:
    import torch

    torch.set_num_threads(1)
    clock = _Clock(batches - 1)
    with tempfile.TemporaryDirectory() as workdir:
        if variant == "lightning":
            _run_lightning(batches, clock)
        else:
            _run_bridge(batches, clock, workdir)
    if int(os.environ.get("RANK", "0")) == 0:
        rate = (batches - 1 - WARMUP) / (clock.end - clock.start)
        pathlib.Path(result).write_text(json.dumps({"batches_per_s": rate}))


def _launch(variant: str, batches: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        result = pathlib.Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            __file__, "--worker", variant, "--batches", str(batches), "--result", str(result),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=tmp, capture_output=True, text=True)
        return float(json.loads(result.read_text())["batches_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=["lightning", "bridge"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.batches, args.result)
        return
    rates: dict[str, list[float]] = {"lightning": [], "bridge": []}
    for r in range(args.rounds):
        order = ["lightning", "bridge"] if r % 2 == 0 else ["bridge", "lightning"]
        for variant in order:
            rate = _launch(variant, args.batches)
            rates[variant].append(rate)
            print(f"round {r + 1}/{args.rounds} {variant:9s} {rate:7.2f} batches/s", flush=True)
    ratios = [b / lt for b, lt in zip(rates["bridge"], rates["lightning"], strict=True)]
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["bridge"] / med["lightning"]
    verdict = "PASS" if ratio >= 0.98 else "MISS"
    print(f"\nmedian batches/s (2 processes): lightning {med['lightning']:.2f}, "
          f"bridge {med['bridge']:.2f}")  # fmt: skip
    print(f"bridge / lightning throughput {ratio:.3f} [per-round {min(ratios):.3f}-"
          f"{max(ratios):.3f}]  target >= 0.98  {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
