"""The worker side of `scaling.py`: one rank of a raw or a bridge run of the tiny model.

A run is `processes` ranks (gloo, CPU) training the tiny MLP of `overhead.py` for `batches`
batches with `aggregation` batches per optimizer step. `raw` is the hand-written loop a user
would write for that: `DistributedDataParallel`, a `DistributedSampler`, `no_sync()` on the
batches that only accumulate, the accumulated gradients averaged before the step (on one
process: no DDP, no process group). `bridge` is
the same task as a `PyTorchTrial` under `lightning_bridge.Trainer` with
`aggregation_frequency`. The ranks rendezvous through torchrun's environment variables, which
the driver sets (the bridge sees an already launched run, as under torchrun).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time
from typing import Any

import _harness as h
import _instructions as instructions
from _overhead_worker import MODELS, REPORT_EVERY, LossReport, Marks, _datasets, _recipe


def _run_raw(recipe: h.Recipe, batches: int, aggregation: int) -> None:
    import torch

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    try:
        model: Any = recipe.model()
        if distributed:
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = recipe.optimizer(model.parameters())
        data = recipe.train_data()
        sampler: Any = (
            torch.utils.data.DistributedSampler(data, shuffle=True)
            if distributed
            else torch.utils.data.RandomSampler(data)
        )
        loader = torch.utils.data.DataLoader(data, batch_size=recipe.batch_size, sampler=sampler)
        report, epoch = LossReport(batches), 0
        model.train()
        while report.done < batches:
            if distributed:
                sampler.set_epoch(epoch)
            epoch += 1
            for x, y in loader:
                Marks.step_begins()
                steps = (report.done + 1) % aggregation == 0
                if steps or not distributed:
                    loss = recipe.loss(model(x), y)
                    loss.backward()
                else:
                    with model.no_sync():
                        loss = recipe.loss(model(x), y)
                        loss.backward()
                if steps:
                    if aggregation > 1:
                        for p in model.parameters():
                            if p.grad is not None:
                                p.grad.div_(aggregation)
                    opt.step()
                    opt.zero_grad()
                last = report.add(loss)
                Marks.step_ends()
                if last:
                    break
    finally:
        if distributed:
            torch.distributed.destroy_process_group()


def _run_bridge(recipe: h.Recipe, batches: int, aggregation: int, workdir: pathlib.Path) -> None:
    import lightning_bridge as pytorch

    options: dict[str, Any] = {
        "accelerator": "cpu",
        "run_dir": workdir,
        "checkpoint_dir": workdir / "checkpoints",
        "aggregation_frequency": aggregation,
    }
    h.fit_trial(pytorch, recipe, batches, {"lr": 0.01}, REPORT_EVERY, **options)


def worker(variant: str, batches: int, aggregation: int) -> dict[str, Any]:
    """Run one rank in this process and return its measurements."""
    import torch

    import lightning_bridge  # noqa: F401  (imported before the clock, like torch)

    torch.set_num_threads(1)
    spec = MODELS["tiny"]
    recipe = _recipe(spec, _datasets(spec))
    with (
        tempfile.TemporaryDirectory(prefix="scaling-") as tmp,
        h.reference_dirs(pathlib.Path(tmp)),
    ):
        Marks.batches = batches
        instructions.begin()
        t0 = time.perf_counter()
        if variant == "raw":
            _run_raw(recipe, batches, aggregation)
        else:
            _run_bridge(recipe, batches, aggregation, pathlib.Path(tmp))
        t_end = time.perf_counter()
        instructions.end("wind-down")
    first, last = Marks.first, Marks.last
    if first is None or last is None:
        raise RuntimeError(f"{variant}: the training step never ran")
    return {
        "variant": variant,
        "rank": int(os.environ.get("RANK", "0")),
        "batches": batches,
        "total_s": t_end - t0,
        "ms_per_batch": (last - first) / batches * 1e3,
    }
