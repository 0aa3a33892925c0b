"""Training-loop overhead: raw PyTorch vs plain Lightning vs lightning_bridge vs determined.

Two models are trained for the same number of batches on the same in-memory data:

* ``tiny``: a 32->32->1 MLP, batch 32; the loop's own per-batch cost dominates.
* ``wide``: a 512->2048->2048->512 MLP, batch 32; the matrix products dominate (about 25 ms
  a batch on one thread of a small cloud CPU, against well under 1 ms of loop overhead).

Each model runs under four variants:

* ``raw``: a hand-written PyTorch loop (forward, backward, SGD step, zero_grad), with a
  loss average every 100 batches and a small validation pass at the end.
* ``lightning``: a plain ``LightningModule`` with manual optimization under
  ``lightning.Trainer(max_steps=...)``, no logger, checkpointing, progress bar or validation.
* ``bridge``: a ``PyTorchTrial`` trained by ``lightning_bridge.Trainer.fit`` (reporting every
  100 batches, validation and checkpoint at the end, as Determined does).
* ``reference``: the same trial class code trained by ``determined.pytorch`` in local mode
  (skipped when ``determined`` is not importable).

Every run is a fresh subprocess, so each variant pays its own start-up and its peak RSS is its
own. Rounds are interleaved: each round runs every variant once, in a rotated order. The timed
part starts after the imports and the data generation and ends when training (and, where the
variant has them, the final validation and checkpoint) is done; it is split into start-up
(until the first training batch begins), the steady batches, and the wind-down after the last
batch.

Usage::

    python bench/overhead.py [--batches 2000] [--rounds 3] [--quick] [--json out.json]

One run of one variant, optionally under cProfile (for finding where the time goes)::

    python bench/overhead.py --worker bridge --model tiny --batches 2000 --profile bridge.prof
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import _harness as h

SEED = 1234
LR = 0.01
REPORT_EVERY = 100
TRAIN_EPOCH_BATCHES = 250  # batches per pass over the training set
VAL_BATCHES = 4

VARIANTS = ("raw", "lightning", "bridge", "reference")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    dims: tuple[int, ...]
    batch_size: int


MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(dims=(32, 32, 1), batch_size=32),
    "wide": ModelSpec(dims=(512, 2048, 2048, 512), batch_size=32),
}

# (label, model, numerator variant, denominator variant, what, target); what is "time" (the
# timed part's wall time, with its CPU time shown beside it) or "rss" (peak resident memory).
TARGETS: tuple[tuple[str, str, str, str, str, float], ...] = (
    ("tiny  time  bridge / reference", "tiny", "bridge", "reference", "time", 1.0),
    ("tiny  time  bridge / lightning", "tiny", "bridge", "lightning", "time", 1.05),
    ("wide  time  bridge / raw", "wide", "bridge", "raw", "time", 1.03),
    ("tiny  RSS   bridge / lightning", "tiny", "bridge", "lightning", "rss", 1.1),
    ("wide  RSS   bridge / lightning", "wide", "bridge", "lightning", "rss", 1.1),
)

# Ratios printed for reading only: (label, model, numerator, denominator, key).
INFO_RATIOS: tuple[tuple[str, str, str, str, str], ...] = (
    ("tiny  ms/batch bridge / lightning", "tiny", "bridge", "lightning", "ms_per_batch"),
    ("tiny  ms/batch bridge / reference", "tiny", "bridge", "reference", "ms_per_batch"),
    ("tiny  ms/batch lightning / raw", "tiny", "lightning", "raw", "ms_per_batch"),
    ("tiny  ms/batch reference / raw", "tiny", "reference", "raw", "ms_per_batch"),
    ("wide  ms/batch bridge / raw", "wide", "bridge", "raw", "ms_per_batch"),
    ("wide  ms/batch lightning / raw", "wide", "lightning", "raw", "ms_per_batch"),
    ("wide  time  lightning / raw", "wide", "lightning", "raw", "total_s"),
    ("wide  time  bridge / lightning", "wide", "bridge", "lightning", "total_s"),
    ("wide  time  bridge / reference", "wide", "bridge", "reference", "total_s"),
)


# --------------------------------------------------------------------------------------------
# Worker side: one variant, one model, one process.
# --------------------------------------------------------------------------------------------


class Marks:
    """Wall-clock readings taken inside the training step (identical code in every variant)."""

    first: float | None = None
    last: float | None = None

    @classmethod
    def step_begins(cls, batch_idx: int = 0) -> None:
        if cls.first is None:
            cls.first = time.perf_counter()

    @classmethod
    def step_ends(cls, batch_idx: int = 0) -> None:
        cls.last = time.perf_counter()


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


def _run_raw(recipe: h.Recipe, batches: int, workdir: pathlib.Path) -> None:
    import torch

    model = recipe.model()
    opt = recipe.optimizer(model.parameters())
    loss_fn = recipe.loss
    loader = torch.utils.data.DataLoader(
        recipe.train_data(), batch_size=recipe.batch_size, shuffle=True
    )
    done = 0
    window: list[torch.Tensor] = []
    model.train()
    while done < batches:
        for x, y in loader:
            Marks.step_begins()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            window.append(loss.detach())
            done += 1
            if done % REPORT_EVERY == 0 or done == batches:
                torch.stack(window).mean().item()
                window.clear()
            Marks.step_ends()
            if done == batches:
                break
    model.eval()
    val_loader = torch.utils.data.DataLoader(recipe.val_data(), batch_size=recipe.batch_size)
    with torch.no_grad():
        torch.stack([loss_fn(model(x), y) for x, y in val_loader]).mean().item()


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
    "bridge": _run_bridge,
    "reference": _run_reference,
}

# Imported before the clock starts. ``torch._dynamo`` is imported by Lightning but otherwise
# lazily by the first optimizer constructed (over a second here); importing it up front keeps
# that one-off import out of every variant's timed part alike.
VARIANT_IMPORTS: dict[str, tuple[str, ...]] = {
    "raw": ("torch", "torch._dynamo"),
    "lightning": ("torch", "torch._dynamo", "lightning.pytorch"),
    "bridge": ("torch", "torch._dynamo", "lightning.pytorch", "lightning_bridge"),
    "reference": ("torch", "torch._dynamo", "determined.pytorch"),
}


def worker(
    variant: str, model: str, batches: int, threads: int, profile: str | None
) -> dict[str, Any]:
    """Run one variant in this process and return its measurements."""
    import importlib

    for name in VARIANT_IMPORTS[variant]:
        importlib.import_module(name)
    import torch

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
        t0, c0 = time.perf_counter(), time.process_time()
        RUNNERS[variant](recipe, batches, pathlib.Path(tmp))
        t_end, c_end = time.perf_counter(), time.process_time()
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


# --------------------------------------------------------------------------------------------
# Driver side: spawn the workers, interleave rounds, summarise.
# --------------------------------------------------------------------------------------------


def available_variants() -> dict[str, str | None]:
    """Map each variant to None when runnable, else to the reason it is skipped."""
    out: dict[str, str | None] = {}
    for variant, modules in VARIANT_IMPORTS.items():
        missing = [m for m in modules if importlib.util.find_spec(m.split(".")[0]) is None]
        out[variant] = f"{', '.join(missing)} not importable" if missing else None
    return out


def summarise(
    results: dict[tuple[str, str], list[dict[str, Any]]],
    models: Sequence[str],
    variants: Sequence[str],
    skipped: dict[str, str],
) -> list[dict[str, Any]]:
    """Print the table of medians and the ratios; return the target verdicts."""
    columns = (
        ("total s", "total_s", 9, 3),
        ("CPU s", "cpu_total_s", 9, 3),
        ("start-up s", "startup_s", 11, 3),
        ("ms/batch", "ms_per_batch", 10, 4),
        ("wind-down s", "winddown_s", 12, 3),
        ("peak RSS MiB", "peak_rss_mib", 13, 1),
    )
    header = f"{'model':<6}{'variant':<11}{'runs':>5}" + "".join(
        f"{title:>{width}}" for title, _, width, _ in columns
    )
    print("medians per variant")
    print(header)
    print("-" * len(header))
    for model in models:
        for variant in variants:
            runs = results.get((model, variant), [])
            if runs:
                cells = "".join(
                    f"{statistics.median(r[key] for r in runs):>{width}.{digits}f}"
                    for _, key, width, digits in columns
                )
                print(f"{model:<6}{variant:<11}{len(runs):>5}{cells}")
    for variant, why in skipped.items():
        print(f"note: {variant} skipped ({why})")
    print()

    def ratio(model: str, num: str, den: str, key: str) -> h.Ratio | None:
        a, b = results.get((model, num), []), results.get((model, den), [])
        if not a or not b:
            return None
        return h.ratio_of_medians([x[key] for x in a], [y[key] for y in b])

    def show(r: h.Ratio) -> str:
        return f"{r.value:6.3f} [{r.span()}]"

    verdicts: list[dict[str, Any]] = []
    print("targets: ratio of medians [per-round range]; time verdicts are on wall time")
    for label, model, num, den, what, target in TARGETS:
        key = "total_s" if what == "time" else "peak_rss_mib"
        r = ratio(model, num, den, key)
        if r is None:
            print(f"  {label:<34} {'n/a':<21} target <= {target:<5} SKIP")
            verdicts.append({"label": label, "ratio": None, "target": target, "met": None})
            continue
        met, word = h.verdict(r.value, target)
        line = f"  {label:<34} {show(r)}  target <= {target:<5} {word}"
        verdict: dict[str, Any] = {"label": label, "ratio": r.value, "target": target, "met": met}
        if what == "time":
            c = ratio(model, num, den, "cpu_total_s")
            if c is not None:
                line += f"   (CPU time {show(c)})"
                verdict["cpu_ratio"] = c.value
        print(line)
        verdicts.append(verdict)
    print("for reading: ratio of medians [per-round range]")
    for label, model, num, den, key in INFO_RATIOS:
        r = ratio(model, num, den, key)
        if r is not None:
            print(f"  {label:<34} {show(r)}")
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000, help="training batches per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--quick", action="store_true", help="smoke configuration: 300 batches, 1 round"
    )
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads in every variant (default 1: steadier on small machines)",
    )
    parser.add_argument("--json", help="also write every run and the verdicts to this file")
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a target is missed"
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help="with --worker: write cProfile stats of the timed part")
    args = parser.parse_args(argv)

    if args.worker:
        if not args.model:
            parser.error("--worker needs --model")
        out = worker(args.worker, args.model, args.batches, args.threads, args.profile)
        text = json.dumps(out)
        if args.result:
            pathlib.Path(args.result).write_text(text)
        print(text)
        return 0

    batches, rounds = (300, 1) if args.quick else (args.batches, args.rounds)
    if batches < 1 or rounds < 1:
        parser.error("--batches and --rounds must be at least 1")
    status = available_variants()
    skipped = {v: why for v, why in status.items() if why is not None and v in args.variants}
    variants = [v for v in args.variants if status[v] is None]
    versions = h.package_versions(("torch", "lightning", "lightning-bridge", "determined"))
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
    )
    shapes = ", ".join(f"{m} {MODELS[m].dims} bs {MODELS[m].batch_size}" for m in args.models)
    print(f"{batches} batches x {rounds} round(s), threads={args.threads}, models: {shapes}")
    sys.stdout.flush()

    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="overhead-logs-") as logs:
        for rnd in range(rounds):
            for model in args.models:
                for variant in h.rotated(variants, rnd):
                    run = h.launch(
                        __file__,
                        ["--worker", variant, "--model", model, "--batches", str(batches)]
                        + ["--threads", str(args.threads)],
                        label=f"{model}/{variant}",
                        work_dir=pathlib.Path(logs),
                    )
                    results.setdefault((model, variant), []).append(run)
                    print(
                        f"  round {rnd + 1}/{rounds} {model:<5} {variant:<10} "
                        f"{run['total_s']:8.3f} s (CPU {run['cpu_total_s']:8.3f} s) "
                        f"{run['peak_rss_mib']:7.1f} MiB",
                        flush=True,
                    )
    load_after = os.getloadavg()[0]
    print(
        f"(benchmark took {time.perf_counter() - started:.0f} s; 1-minute load average "
        f"{load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} CPUs)\n"
    )
    verdicts = summarise(results, args.models, variants, skipped)
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps(
                {
                    "batches": batches,
                    "rounds": rounds,
                    "threads": args.threads,
                    "load_average": [load_before, load_after],
                    "versions": versions,
                    "runs": [r for runs in results.values() for r in runs],
                    "verdicts": verdicts,
                    "skipped": skipped,
                },
                indent=1,
            )
        )
    missed = any(v["met"] is False for v in verdicts)
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
