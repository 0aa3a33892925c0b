"""Determined's `core_v2` (`determined.experimental.core_v2`): the Core API as module-level
contexts, for reporting from anywhere.

Under `lightning-bridge run`, `init()` gives the trial's contexts (as `core.init()` does).
Anywhere else, `init(config=Config(...))` records an unmanaged experiment with one trial in the
workspace (`_unmanaged`) and reports to it: `experiment list/describe`, `checkpoint list` and
the MLflow mirror see it. `close()` (also at exit) records how it ended.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import warnings
from typing import Any

from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.core._checkpoint import CheckpointContext
from lightning_bridge.core._context import (
    Context,
    DummyDistributedContext,
    context_for_run,
)
from lightning_bridge.core._preempt import PreemptContext, PreemptMode
from lightning_bridge.core._searcher import SearcherContext
from lightning_bridge.core._tensorboard_mode import TensorboardMode
from lightning_bridge.core._train import TrainContext
from lightning_bridge.core._unmanaged import record_unmanaged
from lightning_bridge.translation.services._cluster_info import ClusterInfo
from lightning_bridge.translation.services._run_description import RunDescription

logger = logging.getLogger("lightning_bridge.core")

__all__ = [
    "Config",
    "DefaultConfig",
    "DistributedContext",
    "PreemptMode",
    "TensorboardMode",
    "UnmanagedConfig",
    "close",
    "init",
    "init_context",
    "url_reverse_webui_exp_view",
]

# The contexts `init()` made (None before and after).
train: TrainContext | None = None
distributed: DistributedContext | None = None
preempt: PreemptContext | None = None
checkpoint: CheckpointContext | None = None
searcher: SearcherContext | None = None
info: ClusterInfo | None = None
_context: Context | None = None
_atexit_registered = False


@dataclasses.dataclass
class Config:
    """What an unmanaged experiment is recorded with (Determined's fields; `workspace`,
    `project`, `labels` and the external ids are accepted and noted, not used)."""

    name: str | None = None
    hparams: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    description: str | None = None
    labels: list[str] | None = None
    workspace: str | None = None
    project: str | None = None
    checkpoint_storage: str | dict[str, Any] | None = None
    searcher: dict[str, Any] | None = None
    external_experiment_id: str | None = None
    external_trial_id: str | None = None


@dataclasses.dataclass
class DefaultConfig(Config):
    """Deprecated in Determined 0.38: use `Config`."""

    def __post_init__(self) -> None:
        warnings.warn(
            "'DefaultConfig' class have been deprecated: use the `Config` class instead.",
            FutureWarning,
            stacklevel=3,
        )


@dataclasses.dataclass
class UnmanagedConfig(Config):
    """Deprecated in Determined 0.38: use `Config`."""

    def __post_init__(self) -> None:
        warnings.warn(
            "'UnmanagedConfig' class have been deprecated: use the `Config` class instead.",
            FutureWarning,
            stacklevel=3,
        )


def _merged(
    config: Config | None, defaults: Config | None, unmanaged: Config | None
) -> Config | None:
    if defaults is not None or unmanaged is not None:
        warnings.warn(
            "'defaults' and 'unmanaged' parameters have been deprecated: use `config` instead.",
            FutureWarning,
            stacklevel=3,
        )
    if config is not None:
        return config
    if defaults is None:
        return unmanaged
    if unmanaged is not None:
        for name in ("project", "workspace", "external_experiment_id", "external_trial_id"):
            if getattr(defaults, name) is None:
                setattr(defaults, name, getattr(unmanaged, name))
    return defaults


def init_context(
    *,
    config: Config | None = None,
    defaults: Config | None = None,
    unmanaged: Config | None = None,
    client: Any = None,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """The contexts, as a context manager (`with core_v2.init_context(config=...) as ctx`)."""
    merged = _merged(config, defaults, unmanaged)
    distributed = distributed or DummyDistributedContext()
    described = RunDescription.current()
    if described is None:
        if merged is None:
            raise ValueError(
                "either specify `defaults` or `config`, or run as a managed experiment "
                "(lightning-bridge run)"
            )
        unused = [
            f
            for f in ("labels", "workspace", "project", "external_experiment_id")
            if getattr(merged, f)
        ]
        if unused or merged.external_trial_id:
            logger.warning(
                "core_v2: %s not used: lightning_bridge records the run as a new experiment "
                "in its workspace (LIGHTNING_BRIDGE_WORKSPACE).",
                ", ".join(unused + (["external_trial_id"] if merged.external_trial_id else [])),
            )
        described = record_unmanaged(
            name=merged.name,
            description=merged.description,
            hparams=merged.hparams,
            data=merged.data,
            searcher=merged.searcher,
            checkpoint_storage=checkpoint_storage or merged.checkpoint_storage,
            distributed=distributed,
        )
        logger.info(
            "core_v2: recorded as experiment %d, trial %d (lightning-bridge experiment "
            "describe %d)",
            described.experiment_id,
            described.trial_id,
            described.experiment_id,
        )
        checkpoint_storage = None
    context = context_for_run(
        described, distributed, checkpoint_storage, preempt_mode, tensorboard_mode
    )
    context.info = ClusterInfo(described)  # type: ignore[attr-defined]
    return context


def init(
    *,
    config: Config | None = None,
    defaults: Config | None = None,
    unmanaged: Config | None = None,
    client: Any = None,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> None:
    """Start the module-level contexts (closing any earlier ones); `close()` ends them."""
    global _context, _atexit_registered
    if _context is not None:
        close()
    _context = init_context(
        config=config,
        defaults=defaults,
        unmanaged=unmanaged,
        client=client,
        distributed=distributed,
        checkpoint_storage=checkpoint_storage,
        preempt_mode=preempt_mode,
        tensorboard_mode=tensorboard_mode,
    )
    _context.start()
    _publish(_context)
    if not _atexit_registered:
        atexit.register(close)
        _atexit_registered = True


def _publish(context: Context | None) -> None:
    global train, distributed, preempt, checkpoint, searcher, info
    train = context.train if context is not None else None
    distributed = context.distributed if context is not None else None
    preempt = context.preempt if context is not None else None
    checkpoint = context.checkpoint if context is not None else None
    searcher = context.searcher if context is not None else None
    info = getattr(context, "info", None)


def close() -> None:
    """End the module-level contexts: the trial is recorded as ended."""
    global _context
    if _context is not None:
        _context.close()
    _context = None
    _publish(None)


def url_reverse_webui_exp_view() -> str:
    """Where to look at the experiment: the bridge has no web UI of its own; the command that
    shows it."""
    if info is None:
        raise RuntimeError("core_v2.init() first")
    return f"lightning-bridge experiment describe {info.trial.experiment_id}"
