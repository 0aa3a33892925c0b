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
import tempfile
from typing import Any

import _harness as h

DIMS = (512, 2048, 2048, 512)
PER_PROCESS_BATCH = 32
PROCESSES = 2
WARMUP = 20
TARGET = 0.98
VARIANTS = ("lightning", "bridge")


def _recipe(batches: int, clock: h.WindowClock) -> h.Recipe:
    """The task both variants train: the MLP seeded with 0, SGD, MSE, batches in order."""
    import torch

    def model() -> Any:
        torch.manual_seed(0)
        return h.mlp(DIMS)

    def data(n_batches: int) -> Any:
        return h.random_pairs(n_batches * PER_PROCESS_BATCH * PROCESSES, DIMS[0], DIMS[-1], 1)

    return h.Recipe(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        loss=torch.nn.functional.mse_loss,
        train_data=lambda: data(batches),
        val_data=lambda: data(1),
        batch_size=PER_PROCESS_BATCH,
        step_ends=clock.tick,
    )


def _worker(variant: str, batches: int, result: str) -> None:
    import torch

    torch.set_num_threads(1)
    clock = h.WindowClock(WARMUP, batches - 1)
    recipe = _recipe(batches, clock)
    with tempfile.TemporaryDirectory() as workdir:
        if variant == "lightning":
            h.fit_plain(
                recipe,
                batches,
                distributed=True,
                accelerator="cpu",
                devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                strategy="ddp",
                use_distributed_sampler=False,
            )
        else:
            import lightning_bridge as pytorch

            hparams = {"global_batch_size": PER_PROCESS_BATCH * PROCESSES}
            h.fit_trial(pytorch, recipe, batches, hparams, accelerator="cpu", run_dir=workdir)
    if int(os.environ.get("RANK", "0")) == 0:
        pathlib.Path(result).write_text(json.dumps({"batches_per_s": clock.rate()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.batches, args.result)
        return
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r, variant in h.interleaved(args.rounds, VARIANTS):
        with tempfile.TemporaryDirectory() as tmp:
            run = h.launch(
                __file__,
                ["--worker", variant, "--batches", str(args.batches)],
                label=variant,
                work_dir=pathlib.Path(tmp),
                launcher=["-m", "torch.distributed.run", f"--nproc_per_node={PROCESSES}"],
                cwd=tmp,
            )
        rate = float(run["batches_per_s"])
        rates[variant].append(rate)
        print(f"round {r + 1}/{args.rounds} {variant:9s} {rate:7.2f} batches/s", flush=True)
    ratio = h.ratio_of_medians(rates["bridge"], rates["lightning"])
    _, verdict = h.verdict(ratio.value, TARGET, at_least=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"\nmedian batches/s ({PROCESSES} processes): lightning {med['lightning']:.2f}, "
        f"bridge {med['bridge']:.2f}"
    )
    print(
        f"bridge / lightning throughput {ratio.value:.3f} [per-round {ratio.span()}]  "
        f"target >= {TARGET}  {verdict}"
    )


if __name__ == "__main__":
    main()
