"""Engine settings checked against what Lightning accepts, before anything is built.

`init()` and `lightning-bridge run` hand `accelerator`, `devices`, `num_nodes`, `strategy` and
`precision` to Lightning; a value it refuses would only surface as its traceback when the fit
builds the `lightning.Trainer`, after the trial was built. These checks ask Lightning itself:
its accelerator and strategy registries, its precision values and the chosen accelerator's
own device parser. Each failure names the setting and what was given, and lists the values
accepted on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.strategies import Strategy, StrategyRegistry

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.translation._lightning_private import precision_values

# How Lightning picks an accelerator for "auto" (and which "gpu" may mean), first available.
_AUTO_ORDER = ("tpu", "mps", "cuda", "cpu")
_GPU_BACKENDS = ("mps", "cuda")


def _available(name: str) -> bool:
    try:
        return bool(AcceleratorRegistry[name]["accelerator"].is_available())
    except Exception:  # noqa: BLE001 - a backend that cannot even be asked is not available
        return False


def available_accelerators() -> list[str]:
    """The registered accelerators this machine can run, in Lightning's order of preference."""
    names = AcceleratorRegistry.available_accelerators()
    ordered = [n for n in _AUTO_ORDER if n in names] + sorted(set(names) - set(_AUTO_ORDER))
    return [n for n in ordered if _available(n)]


def accepted_precisions() -> list[Any]:
    """Lightning's precision values (the names, their short aliases and the integers)."""
    return precision_values()


def resolve_accelerator(accelerator: Any, spell: Callable[[str], str]) -> str | None:
    """The registry name of the accelerator Lightning will use (None for an instance)."""
    if isinstance(accelerator, Accelerator):
        return None
    usable = available_accelerators()
    if not isinstance(accelerator, str):
        raise InvalidArgumentError(
            f"{spell('accelerator')}: expected a name, got {accelerator!r}; accepted here: "
            f"auto, {', '.join(usable)}."
        )
    name = accelerator.lower()
    registered = AcceleratorRegistry.available_accelerators()
    if name == "auto":
        return next((n for n in _AUTO_ORDER if n in usable), "cpu")
    if name == "gpu":
        backends = [n for n in _GPU_BACKENDS if n in usable]
        if not backends:
            raise InvalidArgumentError(
                f"{spell('accelerator')}: 'gpu' needs a GPU backend (CUDA or MPS) and this "
                f"machine has none; accepted here: auto, {', '.join(usable)}."
            )
        return backends[0]
    if name not in registered:
        raise InvalidArgumentError(
            f"{spell('accelerator')}: unknown accelerator {accelerator!r}; Lightning accepts "
            f"auto, gpu, {', '.join(sorted(registered))} (here: auto, {', '.join(usable)})."
        )
    if name not in usable:
        raise InvalidArgumentError(
            f"{spell('accelerator')}: {name} is not available on this machine; accepted here: "
            f"auto, {', '.join(usable)}."
        )
    return name


def _check_devices(devices: Any, accelerator: str | None, spell: Callable[[str], str]) -> None:
    if devices is None or devices == "auto" or accelerator is None:
        return
    accepted = (
        "a positive number of processes or 'auto'"
        if accelerator == "cpu"
        else "a number of devices, -1 (all), 'auto', or device indices such as '0,1' or [0, 1]"
    )
    problem = None
    if isinstance(devices, bool) or devices in ([], 0, "0"):
        problem = "no device"
    else:
        try:
            AcceleratorRegistry[accelerator]["accelerator"].parse_devices(devices)
        except Exception as exc:  # noqa: BLE001 - Lightning raises TypeError, ValueError, ...
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if problem is not None:
        raise InvalidArgumentError(
            f"{spell('devices')}: {devices!r} is not accepted with the {accelerator} "
            f"accelerator ({problem}); give {accepted}."
        )


def _check_strategy(strategy: Any, spell: Callable[[str], str]) -> None:
    if strategy is None or isinstance(strategy, Strategy):
        return
    names = StrategyRegistry.available_strategies()
    if isinstance(strategy, str) and (strategy.lower() == "auto" or strategy.lower() in names):
        return
    raise InvalidArgumentError(
        f"{spell('strategy')}: unknown strategy {strategy!r}; Lightning accepts auto, "
        f"{', '.join(names)} (or a lightning.pytorch.strategies.Strategy instance)."
    )


def _check_precision(precision: Any, spell: Callable[[str], str]) -> None:
    if precision is None:
        return
    accepted = accepted_precisions()
    if not accepted or (not isinstance(precision, bool) and precision in accepted):
        return
    names = ", ".join(str(v) for v in accepted if isinstance(v, str))
    raise InvalidArgumentError(
        f"{spell('precision')}: unknown precision {precision!r}; Lightning accepts {names} "
        "(or the integers 64, 32, 16)."
    )


def check_engine(
    *,
    accelerator: Any = "auto",
    devices: Any = None,
    num_nodes: Any = 1,
    strategy: Any = None,
    precision: Any = None,
    spell: Callable[[str], str] = lambda name: f"{name}=",
) -> str | None:
    """Check the engine settings Lightning will get; raise InvalidArgumentError listing the
    accepted values. Returns the accelerator Lightning will pick (registry name, or None
    for an Accelerator instance). `spell` names a setting in messages (`--devices`)."""
    _check_precision(precision, spell)
    _check_strategy(strategy, spell)
    name = resolve_accelerator(accelerator if accelerator is not None else "auto", spell)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise InvalidArgumentError(f"{spell('num_nodes')}: expected a positive integer.")
    _check_devices(devices, name, spell)
    return name


def capacity(accelerator: str | None) -> tuple[int, str]:
    """How many processes this machine runs side by side with `accelerator`: its devices, or
    its CPU cores (what this process may use)."""
    if accelerator is not None and accelerator != "cpu":
        try:
            count = AcceleratorRegistry[accelerator]["accelerator"].auto_device_count()
        except Exception:  # noqa: BLE001
            count = 1
        return int(count), f"{accelerator} device"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return cores, "CPU core"
