"""`EngineSettings`: where and how a fit runs on `lightning.Fabric`, checked before it is built.

`init()`, `lightning-bridge run` and the adapter build one frozen `EngineSettings` (the
accelerator, devices, nodes, strategy, precision and plugins Fabric gets, plus the loop's
options `trainer_kwargs` may carry: progress bar, model summary, logger, profiler). The fit
hands `fabric_kwargs()` to `lightning.Fabric`. `check()` asks `lightning.fabric` itself, since
the fit runs on Fabric: its accelerator and strategy registries, its precision values and the
chosen accelerator's own device parser; a value Fabric refuses would otherwise surface as its
traceback after the trial was built. Each failure names the setting and what was given, and
lists the values accepted on this machine. Lightning is imported only when a check runs, so
the command answers config errors without it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from lightning_bridge._errors import InvalidArgumentError

# How Lightning picks an accelerator for "auto" (and which "gpu" may mean), first available.
_AUTO_ORDER = ("tpu", "mps", "cuda", "cpu")
_GPU_BACKENDS = ("mps", "cuda")

# `trainer_kwargs` keys with a meaning for the fit (other lightning.Trainer options configure
# the Trainer's own loop, which a trial's fit does not run on): Fabric's, then the loop's.
FABRIC_KEYS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "plugins")
LOOP_KEYS = ("enable_progress_bar", "enable_model_summary", "logger", "profiler")

Spell = Callable[[str], str]


def _init_spelling(name: str) -> str:
    return f"{name}="


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    """The engine of one fit: Fabric's arguments and the loop's options (see the module)."""

    accelerator: Any = "auto"
    devices: Any = None
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: Any = None
    plugins: Any = None
    # The loop's options (`trainer_kwargs`): `logger` None / True for the default loggers,
    # False for none, or Lightning loggers; `profiler` a Lightning profiler or its name.
    progress_bar: bool = True
    model_summary: bool = True
    logger: Any = None
    profiler: Any = None

    @classmethod
    def from_trainer_kwargs(
        cls, trainer_kwargs: Mapping[str, Any] | None, **fabric: Any
    ) -> EngineSettings:
        """Settings from `init()`'s engine arguments and its `trainer_kwargs` (whose Fabric
        keys take precedence); a key of `lightning.Trainer`'s own loop is refused."""
        extra = dict(trainer_kwargs or {})
        unknown = sorted(set(extra) - set(FABRIC_KEYS) - set(LOOP_KEYS))
        if unknown:
            raise InvalidArgumentError(
                f"trainer_kwargs {', '.join(map(repr, unknown))} configure lightning.Trainer's "
                "own loop, which Trainer.fit does not run on (its loop is the trial's, on "
                f"lightning.Fabric); supported keys: {', '.join(FABRIC_KEYS + LOOP_KEYS)}. Clip "
                "gradients in the trial (step_optimizer(opt, clip_grads=...)) and accumulate "
                "them with aggregation_frequency; or hand TrialModule(trial, context) to your "
                "own lightning.Trainer, which takes its schedule arguments, callbacks and "
                "gradient_clip_val / gradient_clip_algorithm (applied to the trial's "
                "optimizers)."
            )
        fabric.update({k: v for k, v in extra.items() if k in FABRIC_KEYS})
        return cls(
            **fabric,
            progress_bar=bool(extra.get("enable_progress_bar", True)),
            model_summary=bool(extra.get("enable_model_summary", True)),
            logger=extra.get("logger"),
            profiler=extra.get("profiler"),
        )

    def replace(self, **changes: Any) -> EngineSettings:
        return dataclasses.replace(self, **changes)

    def fabric_kwargs(self) -> dict[str, Any]:
        """The arguments of `lightning.Fabric(...)` (one device unless told otherwise)."""
        kwargs: dict[str, Any] = {
            "accelerator": self.accelerator,
            "devices": self.devices if self.devices is not None else 1,
            "num_nodes": self.num_nodes,
            "strategy": self.strategy,
        }
        if self.precision is not None:
            kwargs["precision"] = self.precision
        if self.plugins is not None:
            kwargs["plugins"] = self.plugins
        return kwargs

    def precision_name(self) -> str | None:
        """Fabric's own name for the precision (`"bf16"` -> `"bf16-mixed"`, `16` ->
        `"16-mixed"`, `"32"` -> `"32-true"`), None for a value Fabric does not take."""
        value = self.precision
        if isinstance(value, bool) or value not in accepted_precisions():
            return None
        text = str(value)
        if text in ("16", "bf16"):
            return f"{text}-mixed"
        if text in ("32", "64"):
            return f"{text}-true"
        return text

    # ----- JSON (the run description: names and numbers only) -----

    def to_json(self) -> dict[str, Any]:
        """The Fabric settings as JSON values; an object (a Strategy instance, a logger)
        cannot travel to another process and is refused."""
        data = {name: getattr(self, name) for name in FABRIC_KEYS}
        for name, value in data.items():
            if not _is_json(value):
                raise InvalidArgumentError(
                    f"{name}={value!r} cannot be written to a run description; give a name "
                    "or a number."
                )
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSettings:
        return cls(**{name: data[name] for name in FABRIC_KEYS if name in data})

    # ----- checks against lightning.fabric -----

    def check(self, spell: Spell = _init_spelling) -> str | None:
        """Check the settings Fabric will get; raise InvalidArgumentError listing the accepted
        values. Returns the accelerator Fabric will pick (its registry name; None for an
        Accelerator instance). `spell` names a setting in messages (`--devices`)."""
        _check_precision(self.precision, spell)
        _check_strategy(self.strategy, spell)
        accelerator = self.accelerator if self.accelerator is not None else "auto"
        name = resolve_accelerator(accelerator, spell)
        nodes = self.num_nodes
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise InvalidArgumentError(f"{spell('num_nodes')}: expected a positive integer.")
        _check_devices(self.devices, name, spell)
        return name


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    return isinstance(value, (list, tuple)) and all(_is_json(v) for v in value)


def _registry() -> Any:
    from lightning.fabric.accelerators import ACCELERATOR_REGISTRY

    return ACCELERATOR_REGISTRY


def _available(name: str) -> bool:
    try:
        return bool(_registry()[name]["accelerator"].is_available())
    except Exception:  # noqa: BLE001 - a backend that cannot even be asked is not available
        return False


def available_accelerators() -> list[str]:
    """The registered accelerators this machine can run, in Lightning's order of preference."""
    names = _registry().available_accelerators()
    ordered = [n for n in _AUTO_ORDER if n in names] + sorted(set(names) - set(_AUTO_ORDER))
    return [n for n in ordered if _available(n)]


def accepted_precisions() -> list[Any]:
    """Fabric's precision values (the names, their short aliases and the integers)."""
    from lightning_bridge.translation._lightning_private import precision_values

    return precision_values()


def resolve_accelerator(accelerator: Any, spell: Spell) -> str | None:
    """The registry name of the accelerator Fabric will use (None for an instance)."""
    from lightning.fabric.accelerators import Accelerator

    if isinstance(accelerator, Accelerator):
        return None
    usable = available_accelerators()
    if not isinstance(accelerator, str):
        raise InvalidArgumentError(
            f"{spell('accelerator')}: expected a name, got {accelerator!r}; accepted here: "
            f"auto, {', '.join(usable)}."
        )
    name = accelerator.lower()
    registered = _registry().available_accelerators()
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


def _check_devices(devices: Any, accelerator: str | None, spell: Spell) -> None:
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
            _registry()[accelerator]["accelerator"].parse_devices(devices)
        except Exception as exc:  # noqa: BLE001 - Lightning raises TypeError, ValueError, ...
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if problem is not None:
        raise InvalidArgumentError(
            f"{spell('devices')}: {devices!r} is not accepted with the {accelerator} "
            f"accelerator ({problem}); give {accepted}."
        )


def _check_strategy(strategy: Any, spell: Spell) -> None:
    if strategy is None or isinstance(strategy, str) and strategy.lower() == "auto":
        return
    from lightning.fabric.strategies import STRATEGY_REGISTRY, Strategy

    if isinstance(strategy, Strategy):
        return
    kind = type(strategy)
    if kind.__module__.startswith(("lightning.pytorch.", "pytorch_lightning.")):
        # lightning.Trainer's strategies are separate classes Fabric does not take.
        raise InvalidArgumentError(
            f"{spell('strategy')}: {kind.__module__}.{kind.__name__} is a strategy of "
            "lightning.Trainer; the fit runs on lightning.Fabric, which takes its own: pass "
            f"lightning.fabric.strategies.{kind.__name__}(...) (or a name such as 'ddp')."
        )
    names = STRATEGY_REGISTRY.available_strategies()
    if isinstance(strategy, str) and strategy.lower() in names:
        return
    raise InvalidArgumentError(
        f"{spell('strategy')}: unknown strategy {strategy!r}; Lightning accepts auto, "
        f"{', '.join(names)} (or a lightning.fabric.strategies.Strategy instance)."
    )


def _check_precision(precision: Any, spell: Spell) -> None:
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


def capacity(accelerator: str | None) -> tuple[int, str]:
    """How many processes this machine runs side by side with `accelerator`: its devices, or
    its CPU cores (what this process may use)."""
    if accelerator is not None and accelerator != "cpu":
        try:
            count = _registry()[accelerator]["accelerator"].auto_device_count()
        except Exception:  # noqa: BLE001
            count = 1
        return int(count), f"{accelerator} device"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return cores, "CPU core"
