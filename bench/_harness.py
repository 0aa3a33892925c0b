"""What the benchmarks share: the task they train, and how runs are launched, timed and judged.

Only the standard library is imported at the top: torch and Lightning are imported where used,
so a worker that times its own imports (``overhead.py``) gets nothing extra before its clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

# Trainer switches that only print: off in every variant, plain Lightning and bridge alike.
QUIET: dict[str, Any] = {"enable_progress_bar": False, "enable_model_summary": False}


def mlp(dims: Sequence[int]) -> Any:
    """``Linear`` layers through ``dims`` with ReLUs between; unseeded (the caller seeds)."""
    import torch

    layers: list[torch.nn.Module] = []
    for fan_in, fan_out in zip(dims[:-2], dims[1:-1], strict=True):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(dims[-2], dims[-1]))
    return torch.nn.Sequential(*layers)


def random_pairs(n: int, n_in: int, n_out: int, seed: int) -> Any:
    """``n`` standard-normal (input, target) pairs from a generator of their own, so building
    the data leaves the global random state alone."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(
        torch.randn(n, n_in, generator=gen), torch.randn(n, n_out, generator=gen)
    )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One benchmark's training task, shared by its trial and its plain Lightning module so
    that the variants differ only in the framework around the step."""

    model: Callable[[], Any]  # builds the network (seeding first where the bench wants it)
    optimizer: Callable[[Iterable[Any]], Any]  # parameters -> optimizer
    loss: Callable[[Any, Any], Any]  # (prediction, target) -> scalar loss
    train_data: Callable[[], Any]  # -> map-style dataset
    val_data: Callable[[], Any]
    batch_size: int
    val_batch_size: int | None = None  # None: batch_size
    shuffle: bool = False
    step_begins: Callable[[int], None] | None = None  # called with batch_idx, first in a step
    step_ends: Callable[[int], None] | None = None  # called with batch_idx, last in a step
    callbacks: Callable[[Any], dict[str, Any]] | None = None  # api module -> trial callbacks


def trial_class(api: Any, recipe: Recipe, name: str = "BenchTrial", module: str = "") -> type:
    """The benchmark ``PyTorchTrial`` on ``recipe``, written once against the ``determined.pytorch``
    API so ``api`` may be it or ``lightning_bridge``; checkpoints record ``module:name``."""
    begins, ends = recipe.step_begins, recipe.step_ends
    val_batch_size = recipe.val_batch_size or recipe.batch_size

    class BenchTrial(api.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            self.model = context.wrap_model(recipe.model())
            self.opt = context.wrap_optimizer(recipe.optimizer(self.model.parameters()))
            self.loss_fn = recipe.loss

        def build_callbacks(self) -> dict[str, Any]:
            return recipe.callbacks(api) if recipe.callbacks is not None else {}

        def build_training_data_loader(self) -> Any:
            return api.DataLoader(
                recipe.train_data(), batch_size=recipe.batch_size, shuffle=recipe.shuffle
            )

        def build_validation_data_loader(self) -> Any:
            return api.DataLoader(recipe.val_data(), batch_size=val_batch_size)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
            if begins is not None:
                begins(batch_idx)
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            if ends is not None:
                ends(batch_idx)
            return {"loss": loss}

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            return {"val_loss": self.loss_fn(self.model(x), y)}

    BenchTrial.__name__ = BenchTrial.__qualname__ = name
    BenchTrial.__module__ = module or BenchTrial.__module__
    return BenchTrial


def fit_trial(
    api: Any,
    trial: type | Recipe,
    batches: int,
    hparams: dict[str, Any],
    report_every: int = 100,
    fit: dict[str, Any] | None = None,
    **init: Any,
) -> None:
    """Train ``trial`` (a trial class, or a recipe for :func:`trial_class`) for ``batches``
    batches as a Determined user would: ``api.init(**init)`` without TensorBoard, then
    ``api.Trainer(...).fit(**fit)``. The bridge's own Trainer is kept as quiet as plain ones."""
    trial_cls = trial_class(api, trial) if isinstance(trial, Recipe) else trial
    if getattr(api, "__name__", "") == "lightning_bridge":
        init = {"trainer_kwargs": dict(QUIET), **init}
    with api.init(hparams=hparams, enable_tensorboard_logging=False, **init) as context:
        trial_obj = trial_cls(context)
        api.Trainer(trial_obj, context).fit(
            max_length=api.Batch(batches), reporting_period=api.Batch(report_every), **(fit or {})
        )


def fit_plain(recipe: Recipe, max_steps: int, distributed: bool = False, **options: Any) -> None:
    """Train ``recipe`` as a plain manual-optimization ``LightningModule`` under a quiet
    ``lightning.Trainer`` (no logger or checkpointing): the baseline the bridge is held to.
    ``distributed`` shards the training data with an unshuffled ``DistributedSampler``."""
    import lightning.pytorch as pl
    import torch

    begins, ends = recipe.step_begins, recipe.step_ends

    class PlainModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.model = recipe.model()
            self.loss_fn = recipe.loss

        def configure_optimizers(self) -> Any:
            return recipe.optimizer(self.parameters())

        def train_dataloader(self) -> Any:
            data = recipe.train_data()
            sampler: Any = None
            if distributed:
                sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
            return torch.utils.data.DataLoader(
                data, batch_size=recipe.batch_size, shuffle=recipe.shuffle, sampler=sampler
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if begins is not None:
                begins(batch_idx)
            opt: Any = self.optimizers()
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()
            if ends is not None:
                ends(batch_idx)
            return loss

    module = PlainModule()
    trainer = pl.Trainer(
        max_steps=max_steps, logger=False, enable_checkpointing=False, **QUIET, **options
    )
    trainer.fit(module)


class WindowClock:
    """Wall time from the end of step ``warmup`` to the end of step ``last`` (start-up and
    wind-down stay out); ``sync`` (e.g. a CUDA synchronize) runs before both readings."""

    def __init__(self, warmup: int, last: int, sync: Callable[[], None] | None = None) -> None:
        self.warmup, self.last, self.sync = warmup, last, sync
        self.start = self.end = 0.0

    def tick(self, batch_idx: int) -> None:
        if self.sync is not None and batch_idx in (self.warmup, self.last):
            self.sync()
        if batch_idx == self.warmup:
            self.start = time.perf_counter()
        if batch_idx == self.last:
            self.end = time.perf_counter()

    def rate(self, per_batch: float = 1.0) -> float:
        """Batches (times ``per_batch``) per second over the window."""
        return (self.last - self.warmup) * per_batch / (self.end - self.start)


@contextlib.contextmanager
def reference_dirs(workdir: pathlib.Path) -> Iterator[pathlib.Path]:
    """Work in ``workdir/cwd`` with ``XDG_DATA_HOME`` at ``workdir/xdg_data`` (restored after):
    Determined keeps local checkpoints in the latter and copies the former into each as code,
    so the two stay apart and cwd empty. Yields the checkpoint storage both frameworks use."""
    cwd, data = workdir / "cwd", workdir / "xdg_data"
    cwd.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    old_cwd, old_xdg = os.getcwd(), os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(data)
    os.chdir(cwd)
    try:
        yield data / "determined"
    finally:
        os.chdir(old_cwd)
        if old_xdg is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = old_xdg


def launch(
    script: str,
    args: Sequence[str],
    *,
    label: str,
    work_dir: pathlib.Path,
    launcher: Sequence[str] = (),
    cwd: str | pathlib.Path | None = None,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``[prefix] python [launcher] script args --result FILE`` in a fresh process (own
    start-up and peak memory; output logged beside FILE) with ``env`` added to the environment;
    return FILE's JSON, or raise with the log's tail. ``prefix`` is e.g. an instruction
    counter's command (see ``_instructions.wrap``)."""
    result = work_dir / f"{label.replace('/', '-')}-{time.monotonic_ns()}.json"
    log = result.with_suffix(".log")
    cmd = [*prefix, sys.executable, *launcher, str(pathlib.Path(script).resolve()), *args]
    cmd += ["--result", str(result)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text().splitlines()[-30:]
        raise RuntimeError(f"{label} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` rotated left by ``by``: round ``r`` runs ``rotated(variants, r)``, so no
    variant always goes first."""
    if not items:
        return []
    k = by % len(items)
    return list(items[k:]) + list(items[:k])


def interleaved(rounds: int, variants: Sequence[T]) -> Iterator[tuple[int, T]]:
    """(round, variant) for ``rounds`` rounds, each running every variant once, rotated."""
    for rnd in range(rounds):
        for variant in rotated(variants, rnd):
            yield rnd, variant


def peak_rss_mib() -> float:
    """This process's peak resident set size (``VmHWM``), in MiB."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed version of each distribution, ``-`` where missing, for the report header."""
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    return out


class Ratio(NamedTuple):
    """A ratio of medians with the range of the per-round ratios behind it."""

    value: float
    low: float
    high: float

    def span(self) -> str:
        return f"{self.low:.3f}-{self.high:.3f}"


def ratio_of_medians(num: Sequence[float], den: Sequence[float]) -> Ratio:
    """median(num) / median(den), with the range of the position-paired (per-round) ratios,
    which shows how much the machine drifted."""
    per_round = [a / b for a, b in zip(num, den, strict=False)]
    return Ratio(statistics.median(num) / statistics.median(den), min(per_round), max(per_round))


def paired_median(num: Sequence[float], den: Sequence[float]) -> float:
    """Median of num / den over paired samples (same round, same repetition): steadier than a
    ratio of medians when the machine drifts between rounds more than within one."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def verdict(value: float, target: float, at_least: bool = False) -> tuple[bool, str]:
    """Whether ``value`` meets ``target`` (``<=``, or ``>=`` with ``at_least``), and PASS/MISS."""
    met = value >= target if at_least else value <= target
    return met, "PASS" if met else "MISS"
