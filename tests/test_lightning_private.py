"""A Lightning release without one of the private helpers the adapter reuses breaks only the
adapter, with one message naming what is missing and the Lightning versions to install."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from typing import Any

import pytest

SCRIPT = textwrap.dedent(
    """
    import lightning.pytorch.trainer.connectors.logger_connector.fx_validator as fx

    del fx._FxValidator  # as if this Lightning release had moved it

    import lightning_bridge as pytorch

    print("core:", pytorch.Trainer.__name__, pytorch.PyTorchTrial.__name__)
    try:
        pytorch.lightning_trial
    except ImportError as exc:
        print("adapter:", exc)
    """
)


@pytest.mark.slow  # a subprocess of its own
def test_missing_lightning_helper_breaks_only_the_adapter_with_a_clear_message() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "core: Trainer PyTorchTrial" in out
    adapter_line = next(line for line in out.splitlines() if line.startswith("adapter:"))
    assert "_FxValidator" in adapter_line
    assert "lightning_trial, LightningAdapter" in adapter_line
    assert "pip install 'lightning>=2.4,<2.7'" in adapter_line


def test_the_adapter_is_reachable_from_the_package() -> None:
    import lightning_bridge as pytorch
    from lightning_bridge import LightningAdapter, lightning_trial

    assert pytorch.lightning_trial is lightning_trial
    assert isinstance(LightningAdapter, type)


# ----- every private Lightning name the bridge uses, against the installed Lightning ---------

PRIVATE_ATTRIBUTES = {
    "_current_fx_name",
    "_forked_name",
    "_forward_cache",
    "_lightning_optimizers",
    "_to_lightning_optimizer",
    "_batches_that_stepped",
    "_logger_connector",
    "_forward_module",
    "_start_method",
    "_PRECISION_INPUT_STR",
    "_PRECISION_INPUT_STR_ALIAS",
    "_PRECISION_INPUT_INT",
}
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")


def test_private_names_are_used_in_one_module_only() -> None:
    import ast
    import pathlib

    import lightning_bridge

    root = pathlib.Path(lightning_bridge.__file__).parent
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "translation/_lightning_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            package = (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else ""
            if package in LIGHTNING_PACKAGES:
                found += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
                # A class's own attribute of the same name (self._x) is not Lightning's.
                if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                    found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRIBUTES:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert found == []


def test_every_adapter_helper_is_in_the_installed_lightning() -> None:
    import lightning.pytorch as pl
    import pytorch_lightning

    from lightning_bridge.translation import _lightning_private as private

    private.require_adapter_helpers()
    for name in private.ADAPTER_HELPERS:
        assert callable(getattr(private, name)), name
    for package in (pl, pytorch_lightning):
        helpers = private.optimizer_helpers(package)
        assert helpers.__name__ == f"{package.__name__}.core.optimizer"
        for name in private.OPTIMIZER_HELPERS:
            assert callable(getattr(helpers, name)), (package.__name__, name)


def test_the_fit_on_fabrics_private_names() -> None:
    import lightning as L
    import torch

    from lightning_bridge.translation import _lightning_private as private

    fabric = L.Fabric(accelerator="cpu", devices=1)
    module = torch.nn.Linear(2, 1)
    assert private.forward_module(fabric.setup_module(module)) is module
    spawn = L.Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").strategy.launcher
    assert private.is_multiprocessing_launcher(spawn)
    assert private.start_method(spawn) == "spawn"
    assert not private.is_multiprocessing_launcher(object())
    values = private.precision_values()
    assert {"32-true", "bf16-mixed", "16-mixed", "64-true", "bf16", 32, 16} <= set(values)


def test_prepare_for_backward_prepares_a_ddp_reducer(tmp_path: Any) -> None:
    import torch
    import torch.distributed as dist

    from lightning_bridge.translation._lightning_private import prepare_for_backward

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        loss = ddp(torch.ones(3, 2)).sum()
        prepare_for_backward(ddp, loss)
        loss.backward()
        grad = ddp.module.weight.grad
        # The DDP reducer, which holds the process group, goes first: destroyed after the
        # group, its last reference to it joined gloo's threads and hung, now and then.
        del ddp, loss
        gc.collect()
        assert grad is not None
        assert torch.equal(grad, torch.full((1, 2), 3.0))
    finally:
        dist.destroy_process_group()


def test_the_adapters_private_attributes() -> None:
    import inspect
    import types

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import lr_monitor
    from lightning.pytorch.core.optimizer import LightningOptimizer

    from lightning_bridge.translation import _lightning_private as private

    module = pl.LightningModule()
    assert private.current_hook(module) is None
    private.set_current_hook(module, "training_step")
    assert private.current_hook(module) == "training_step"

    results = private._ResultCollection(training=True)
    value = torch.tensor(2.5)
    results.log("training_step", "loss", value, on_step=True, on_epoch=True, batch_size=4)
    (metric,) = [m for _, m in results.items()]
    assert private.forked_names(results, metric, True) == ("loss", "loss_step")
    assert private.forked_names(results, metric, False) == ("loss", "loss_epoch")
    assert torch.equal(private.step_value(metric), value)

    # LightningModule.optimizers() reads what set_lightning_optimizers sets.
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)

    class Strategy:
        """What LightningOptimizer keeps a weak reference to."""

    strategy = Strategy()
    private.set_lightning_optimizers(strategy, [opt], pl)
    module.trainer = types.SimpleNamespace(strategy=strategy)  # type: ignore[assignment]
    wrapped = module.optimizers()
    assert isinstance(wrapped, LightningOptimizer) and wrapped.optimizer is opt
    assert private.lightning_optimizers(strategy) == [wrapped]

    # LearningRateMonitor reads the step count and the logging switch where attach_fit_loop
    # puts them.
    source = inspect.getsource(lr_monitor)
    assert "fit_loop.epoch_loop._batches_that_stepped" in source
    assert "_logger_connector.should_update_logs" in source
    trainer = types.SimpleNamespace()
    private.attach_fit_loop(trainer, lambda: 7, lambda: True)
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 7
    assert trainer._logger_connector.should_update_logs is True
