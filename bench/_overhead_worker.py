"""The worker side of `overhead.py`: one variant trains one model in this process.

Every variant trains the same seeded MLP with SGD on the same in-memory data (shuffled
batches), reports a loss average every `REPORT_EVERY` batches and ends with a small
validation; the bridge, the reference and the Fabric loop also write a final checkpoint.
`Marks` takes identical readings inside every variant's training step; a counted run (see
`_instructions`) splits its instructions at the same points.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _harness as h
import _instructions as instructions

SEED = 1234
LR = 0.01
REPORT_EVERY = 100
TRAIN_EPOCH_BATCHES = 250  # batches per pass over the training set
VAL_BATCHES = 4


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    dims: tuple[int, ...]
    batch_size: int


MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(dims=(32, 32, 1), batch_size=32),
    "wide": ModelSpec(dims=(512, 2048, 2048, 512), batch_size=32),
}


class Marks:
    """Wall-clock readings taken inside the training step, and the phase boundaries of a
    counted run: start-up ends as the first step begins, the steady part as the last ends."""

    first: float | None = None
    last: float | None = None
    steps = 0
    batches = 0

    @classmethod
    def step_begins(cls, batch_idx: int = 0) -> None:
        if cls.first is None:
            cls.first = time.perf_counter()
            instructions.phase("start-up")

    @classmethod
    def step_ends(cls, batch_idx: int = 0) -> None:
        cls.last = time.perf_counter()
        cls.steps += 1
        if cls.steps == cls.batches:
            instructions.phase("steady")


class LossReport:
    """The training report of the hand-written loops, made as a trial's is: each batch's loss
    kept on the device, their average read back every `REPORT_EVERY` batches and at the last.
    `done` counts the batches."""

    def __init__(self, batches: int) -> None:
        import torch

        self._stack = torch.stack
        self._losses: list[Any] = []
        self.batches = batches
        self.done = 0

    def add(self, loss: Any) -> bool:
        """Count one batch with its loss; True when it was the last."""
        self._losses.append(loss.detach())
        self.done += 1
        if self.done % REPORT_EVERY == 0 or self.done == self.batches:
            self._stack(self._losses).mean().item()
            self._losses.clear()
        return self.done == self.batches


def _datasets(spec: ModelSpec) -> tuple[Any, Any]:
    """Training and validation sets: inputs and the outputs of a fixed random linear teacher."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    n_in, n_out = spec.dims[0], spec.dims[-1]
    teacher = torch.randn(n_in, n_out, generator=gen) / n_in**0.5

    def make(n: int) -> torch.utils.data.TensorDataset:
        x = torch.randn(n, n_in, generator=gen)
        y = x @ teacher + 0.1 * torch.randn(n, n_out, generator=gen)
        return torch.utils.data.TensorDataset(x, y)

    return make(TRAIN_EPOCH_BATCHES * spec.batch_size), make(VAL_BATCHES * spec.batch_size)


def _recipe(spec: ModelSpec, data: tuple[Any, Any]) -> h.Recipe:
    """The task every variant trains: the MLP seeded with SEED, SGD, MSE, shuffled batches."""
    import torch

    def model() -> Any:
        torch.manual_seed(SEED)
        return h.mlp(spec.dims)

    train_set, val_set = data
    return h.Recipe(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=LR),
        loss=torch.nn.MSELoss(),
        train_data=lambda: train_set,
        val_data=lambda: val_set,
        batch_size=spec.batch_size,
        shuffle=True,
        step_begins=Marks.step_begins,
        step_ends=Marks.step_ends,
    )


def _hand_written_loop(recipe: h.Recipe, batches: int, fabric: Any = None) -> Any:
    """The raw loop (and, given a `fabric`, the same loop as a Fabric user writes it)."""
    import torch

    model = recipe.model()
    opt = recipe.optimizer(model.parameters())
    loader: Any = torch.utils.data.DataLoader(
        recipe.train_data(), batch_size=recipe.batch_size, shuffle=True
    )
    if fabric is not None:
        model, opt = fabric.setup(model, opt)
        loader = fabric.setup_dataloaders(loader)
    loss_fn = recipe.loss
    report = LossReport(batches)
    model.train()
    while report.done < batches:
        for x, y in loader:
            Marks.step_begins()
            loss = loss_fn(model(x), y)
            if fabric is None:
                loss.backward()
            else:
                fabric.backward(loss)
            opt.step()
            opt.zero_grad()
            last = report.add(loss)
            Marks.step_ends()
            if last:
                break
    model.eval()
    val_loader: Any = torch.utils.data.DataLoader(recipe.val_data(), batch_size=recipe.batch_size)
    if fabric is not None:
        val_loader = fabric.setup_dataloaders(val_loader)
    with torch.no_grad():
        torch.stack([loss_fn(model(x), y) for x, y in val_loader]).mean().item()
    return model, opt


def _run_raw(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    _hand_written_loop(recipe, batches)


def _run_fabric(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1)
    model, opt = _hand_written_loop(recipe, batches, fabric)
    fabric.save(workdir / "fabric.ckpt", {"model": model, "optimizer": opt})


def _run_lightning(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    h.fit_plain(
        recipe,
        batches,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(workdir),
    )


def _run_bridge(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    import lightning_bridge as pytorch

    ckpt = workdir / "checkpoints"
    options: dict[str, Any] = {"accelerator": "cpu", "devices": 1, "run_dir": workdir}
    h.fit_trial(pytorch, recipe, batches, {"lr": LR}, REPORT_EVERY, checkpoint_dir=ckpt, **options)


def _run_reference(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    from determined import pytorch

    h.fit_trial(pytorch, recipe, batches, {"lr": LR}, REPORT_EVERY)


RUNNERS: dict[str, Callable[[h.Recipe, int, pathlib.Path], None]] = {
    "raw": _run_raw,
    "lightning": _run_lightning,
    "fabric": _run_fabric,
    "bridge": _run_bridge,
    "reference": _run_reference,
}
VARIANTS = tuple(RUNNERS)

# Imported before the clock starts. ``torch._dynamo`` is imported by Lightning but otherwise
# lazily by the first optimizer constructed (over a second here); importing it up front keeps
# that one-off import out of every variant's timed part alike.
VARIANT_IMPORTS: dict[str, tuple[str, ...]] = {
    "raw": ("torch", "torch._dynamo"),
    "lightning": ("torch", "torch._dynamo", "lightning.pytorch"),
    "fabric": ("torch", "torch._dynamo", "lightning"),
    "bridge": ("torch", "torch._dynamo", "lightning.pytorch", "lightning_bridge"),
    "reference": ("torch", "torch._dynamo", "determined.pytorch"),
}


def _warm_up_fabric_save(workdir: pathlib.Path) -> None:
    """`fabric.save` imports fsspec and the object-store filesystems installed beside it the
    first time (hundreds of modules); a save before the clock keeps that out of the timing."""
    import lightning as L

    L.Fabric(accelerator="cpu", devices=1).save(workdir / "warm-up.ckpt", {"step": 0})


# One-off work before the clock, beyond the imports (see VARIANT_IMPORTS).
VARIANT_WARM_UPS: dict[str, Callable[[pathlib.Path], None]] = {"fabric": _warm_up_fabric_save}


def worker(
    variant: str, model: str, batches: int, threads: int, profile: str | None
) -> dict[str, Any]:
    """Run one variant in this process and return its measurements."""
    import importlib

    for name in VARIANT_IMPORTS[variant]:
        importlib.import_module(name)
    import torch

    if variant in VARIANT_WARM_UPS:
        with tempfile.TemporaryDirectory(prefix="overhead-warm-up-") as tmp:
            VARIANT_WARM_UPS[variant](pathlib.Path(tmp))

    torch.set_num_threads(threads)
    spec = MODELS[model]
    recipe = _recipe(spec, _datasets(spec))
    profile = os.path.abspath(profile) if profile else None  # the run happens in a temp cwd
    with (
        tempfile.TemporaryDirectory(prefix="overhead-") as tmp,
        h.reference_dirs(pathlib.Path(tmp)),
    ):
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        Marks.batches = batches
        instructions.begin()
        t0, c0 = time.perf_counter(), time.process_time()
        RUNNERS[variant](recipe, batches, pathlib.Path(tmp))
        t_end, c_end = time.perf_counter(), time.process_time()
        instructions.end("wind-down")
        if profiler is not None and profile:
            profiler.disable()
            profiler.dump_stats(profile)
    first, last = Marks.first, Marks.last
    if first is None or last is None:
        raise RuntimeError(f"{variant}: the training step never ran")
    return {
        "variant": variant,
        "model": model,
        "batches": batches,
        "total_s": t_end - t0,
        "startup_s": first - t0,
        "ms_per_batch": (last - first) / batches * 1e3,
        "winddown_s": t_end - last,
        "cpu_total_s": c_end - c0,
        "peak_rss_mib": h.peak_rss_mib(),
    }
