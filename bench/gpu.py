"""Mixed-precision throughput on a GPU: lightning_bridge against a plain Lightning module.

Trains a ResNet-18-shaped network (written out here: no torchvision needed) on synthetic
224x224 images with `precision="16-mixed"` and `"bf16-mixed"`, as a `PyTorchTrial` under
`lightning_bridge.Trainer` and as a plain manual-optimization `LightningModule`, in
interleaved rounds; prints images per second and the bridge / Lightning ratio per precision.
Run it on a machine with a CUDA GPU:

    python bench/gpu.py [--batches 200] [--rounds 3] [--batch-size 128]

`--device cpu --quick` is a small smoke run (bf16-mixed only) for machines without a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

import lightning_bridge as pytorch

WARMUP = 10


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet18(classes: int = 1000) -> nn.Module:
    """A ResNet-18-shaped classifier (about 11.7M parameters)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


class _Images(torch.utils.data.Dataset):
    """Synthetic labelled images (generated once, served from memory)."""

    def __init__(self, n: int, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = torch.randint(0, 1000, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class _Clock:
    def __init__(self, last: int) -> None:
        self.last, self.start, self.end = last, 0.0, 0.0

    def tick(self, batch_idx: int) -> None:
        if batch_idx in (WARMUP, self.last) and torch.cuda.is_available():
            torch.cuda.synchronize()
        if batch_idx == WARMUP:
            self.start = time.perf_counter()
        if batch_idx == self.last:
            self.end = time.perf_counter()


def _plain(args: Any, precision: str, data: _Images, clock: _Clock) -> None:
    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = resnet18()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(data, batch_size=args.batch_size)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            opt = self.optimizers()
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.manual_backward(loss)
            opt.step()  # type: ignore[union-attr]
            opt.zero_grad()  # type: ignore[union-attr]
            clock.tick(batch_idx)

    pl.Trainer(
        accelerator=args.device,
        devices=1,
        precision=precision,  # type: ignore[arg-type]
        max_steps=args.batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Plain())


def _bridge(args: Any, precision: str, data: _Images, clock: _Clock) -> None:
    class Trial(pytorch.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.net = context.wrap_model(resnet18())
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
            )

        def build_training_data_loader(self) -> Any:
            return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

        def build_validation_data_loader(self) -> Any:
            return pytorch.DataLoader(torch.utils.data.Subset(data, range(args.batch_size)))

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            clock.tick(batch_idx)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            return {"val_loss": nn.functional.cross_entropy(self.net(x), y)}

    with (
        tempfile.TemporaryDirectory() as run_dir,
        pytorch.init(
            hparams={"global_batch_size": args.batch_size},
            accelerator=args.device,
            precision=precision,
            run_dir=run_dir,
            enable_tensorboard_logging=False,
            trainer_kwargs={"enable_progress_bar": False, "enable_model_summary": False},
        ) as ctx,
    ):
        pytorch.Trainer(Trial(ctx), ctx).fit(
            max_length=pytorch.Batch(args.batches), reporting_period=pytorch.Batch(100)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    args = parser.parse_args()
    precisions = ["16-mixed", "bf16-mixed"]
    if args.quick:
        args.batches, args.rounds, args.batch_size, args.image_size = 14, 1, 4, 32
    if args.device == "cpu":
        precisions = ["bf16-mixed"]  # Lightning runs fp16 AMP on GPUs only
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU found; use --device cpu --quick for a smoke run")
    data = _Images(args.batches * args.batch_size, args.image_size)
    for precision in precisions:
        rates: dict[str, list[float]] = {"lightning": [], "bridge": []}
        for r in range(args.rounds):
            order = ["lightning", "bridge"] if r % 2 == 0 else ["bridge", "lightning"]
            for variant in order:
                clock = _Clock(args.batches - 1)
                (_plain if variant == "lightning" else _bridge)(args, precision, data, clock)
                rate = (args.batches - 1 - WARMUP) * args.batch_size / (clock.end - clock.start)
                rates[variant].append(rate)
                print(f"{precision:10s} round {r + 1} {variant:9s} {rate:9.1f} images/s")
        ratio = statistics.median(rates["bridge"]) / statistics.median(rates["lightning"])
        print(f"{precision:10s} bridge / lightning throughput {ratio:.3f}\n", flush=True)


if __name__ == "__main__":
    main()
