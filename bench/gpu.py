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
import tempfile
from typing import Any

import _harness as h
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


def _recipe(args: Any, data: _Images, clock: h.WindowClock) -> h.Recipe:
    """The task both variants train: ResNet-18, SGD with momentum, cross-entropy."""
    return h.Recipe(
        model=resnet18,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        loss=nn.functional.cross_entropy,
        train_data=lambda: data,
        val_data=lambda: torch.utils.data.Subset(data, range(args.batch_size)),
        batch_size=args.batch_size,
        val_batch_size=1,
        step_ends=clock.tick,
    )


def _plain(args: Any, precision: str, recipe: h.Recipe) -> None:
    h.fit_plain(recipe, args.batches, accelerator=args.device, devices=1, precision=precision)


def _bridge(args: Any, precision: str, recipe: h.Recipe) -> None:
    hparams = {"global_batch_size": args.batch_size}
    with tempfile.TemporaryDirectory() as run_dir:
        options = {"accelerator": args.device, "precision": precision, "run_dir": run_dir}
        h.fit_trial(pytorch, recipe, args.batches, hparams, **options)


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
    sync = torch.cuda.synchronize if torch.cuda.is_available() else None
    data = _Images(args.batches * args.batch_size, args.image_size)
    for precision in precisions:
        rates: dict[str, list[float]] = {"lightning": [], "bridge": []}
        for r, variant in h.interleaved(args.rounds, ("lightning", "bridge")):
            clock = h.WindowClock(WARMUP, args.batches - 1, sync)
            (_plain if variant == "lightning" else _bridge)(
                args, precision, _recipe(args, data, clock)
            )
            rate = clock.rate(per_batch=args.batch_size)
            rates[variant].append(rate)
            print(f"{precision:10s} round {r + 1} {variant:9s} {rate:9.1f} images/s")
        ratio = h.ratio_of_medians(rates["bridge"], rates["lightning"]).value
        print(f"{precision:10s} bridge / lightning throughput {ratio:.3f}\n", flush=True)


if __name__ == "__main__":
    main()
