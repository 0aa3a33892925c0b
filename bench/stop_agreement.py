"""Per-batch cost of agreeing on a stop across processes (two CPU processes, gloo).

A small DDP step (a 64x64 linear layer, batch 8: about a millisecond, so a collective's cost
shows) runs in interleaved rounds of:

- `none`: no agreement (the step alone);
- `bridge`: `StopRequest.poll()` after every step (an asynchronous all-reduce, read a few
  steps later, spaced about 0.1 s of training apart);
- `async-every`: an asynchronous all-reduce started after every step and read after the next;
- `sync-every`: a blocking all-reduce after every step.

Prints the median microseconds per step of each and the difference to `none`.

    python bench/stop_agreement.py [--steps 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

MODES = ("none", "bridge", "async-every", "sync-every")


def _worker(rank: int, port: int, steps: int, rounds: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from lightning_bridge.translation.services._stop_request import StopRequest

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    group = dist.new_group(backend="gloo")

    def step() -> None:
        opt.zero_grad()
        ddp(x).sum().backward()
        opt.step()

    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            stop = StopRequest()
            stop.begin()
            pending: Any = None
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                step()
                if mode == "bridge":
                    stop.poll()
                elif mode == "async-every":
                    if pending is not None:
                        pending.wait()
                    flag = torch.zeros(1, dtype=torch.int32)
                    pending = dist.all_reduce(flag, group=group, async_op=True)
                elif mode == "sync-every":
                    flag = torch.zeros(1, dtype=torch.int32)
                    dist.all_reduce(flag, group=group)
            elapsed = time.perf_counter() - start
            if pending is not None:
                pending.wait()
            stop.end()
            results[mode].append(elapsed / steps * 1e6)
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=29631)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, args.port, args.steps, args.rounds, queue))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    results = queue.get(timeout=1800)
    for proc in procs:
        proc.join()
    base = statistics.median(results["none"])
    for mode in MODES:
        median = statistics.median(results[mode])
        print(f"{mode:12s} {median:8.1f} us/step   {median - base:+7.1f} us vs none")


if __name__ == "__main__":
    main()
