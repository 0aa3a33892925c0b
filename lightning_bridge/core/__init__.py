"""Determined's Core API (`determined.core`) on the bridge's services."""

from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.core._checkpoint import CheckpointContext, DownloadMode
from lightning_bridge.core._context import (
    Context,
    DummyDistributedContext,
    ExperimentalCoreContext,
    ProfilerContext,
    init,
)
from lightning_bridge.core._preempt import PreemptContext, PreemptMode
from lightning_bridge.core._searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from lightning_bridge.core._tensorboard_mode import TensorboardMode
from lightning_bridge.core._train import EarlyExitReason, TrainContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "ExperimentalCoreContext",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "init",
]
