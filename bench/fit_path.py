"""How many of the package's modules a fit passes through before its first checkpoint save.

A tiny `PyTorchTrial` (a 2->1 linear model, two batches, a checkpoint after each) is trained
with `Trainer.fit` under `sys.setprofile`; every module of `lightning_bridge` with a Python
frame entered on the fit's thread between `fit()` and the first `torch.save` (a module's own
body counts: one first imported during the fit) is listed. The background checkpoint writer's
thread is left out unless `--all-threads`. Prints the modules, one a line, then their count.

    python bench/fit_path.py [--all-threads]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from typing import Any

import torch

import lightning_bridge as pytorch


class TinyTrial(pytorch.PyTorchTrial):  # type: ignore[misc]
    def __init__(self, context: Any) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(2, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _loader(self, n: int) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(n, 2), torch.randn(n, 1))
        return pytorch.DataLoader(data, batch_size=2)

    def build_training_data_loader(self) -> Any:
        return self._loader(8)

    def build_validation_data_loader(self) -> Any:
        return self._loader(4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}


def modules_to_first_save(all_threads: bool) -> list[str]:
    """The package's modules entered from `fit()` to the first `torch.save`, sorted."""
    modules: set[str] = set()
    saved = threading.Event()
    real_save = torch.save

    def marked_save(*args: Any, **kwargs: Any) -> Any:
        saved.set()
        return real_save(*args, **kwargs)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and not saved.is_set():
            name = str(frame.f_globals.get("__name__", ""))
            if name.startswith("lightning_bridge"):
                modules.add(name)

    torch.save = marked_save  # type: ignore[assignment]
    os.chdir(tempfile.mkdtemp())
    config = {"searcher": {"metric": "validation_loss"}}
    try:
        with pytorch.init(hparams={"global_batch_size": 2}, exp_conf=config) as context:
            trainer = pytorch.Trainer(TinyTrial(context), context)
            if all_threads:
                threading.setprofile(profile)
            sys.setprofile(profile)
            try:
                trainer.fit(max_length=pytorch.Batch(2), checkpoint_period=pytorch.Batch(1))
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]
    finally:
        torch.save = real_save
    return sorted(modules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-threads", action="store_true", help="count the writer's too")
    args = parser.parse_args()
    modules = modules_to_first_save(args.all_threads)
    print("\n".join(modules))
    print(f"{len(modules)} modules")


if __name__ == "__main__":
    main()
