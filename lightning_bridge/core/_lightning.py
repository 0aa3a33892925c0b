"""`determined.lightning.experimental.DetLogger`: a Lightning logger that reports a
`lightning.Trainer`'s logged metrics through `core_v2` (to the trial under `lightning-bridge
run`, or to an unmanaged experiment elsewhere), as Determined 0.38.1's did: training metrics
at the step Lightning logs them, the contexts started on first use and closed with the run."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from lightning_bridge.core import _core_v2 as core_v2

__all__ = ["DetLogger"]


class DetLogger(Logger):
    """Reports what a `lightning.Trainer` logs through `core_v2` (see the module docstring)."""

    def __init__(
        self,
        *,
        defaults: core_v2.Config | None = None,
        unmanaged: core_v2.Config | None = None,
        config: core_v2.Config | None = None,
        client: Any = None,
    ) -> None:
        self._kwargs = {
            "defaults": defaults,
            "unmanaged": unmanaged,
            "config": config,
            "client": client,
        }
        self._initialized = False

    @property
    @rank_zero_experiment
    def experiment(self) -> None:
        if not self._initialized:
            core_v2.init(**self._kwargs)
            self._initialized = True

    @property
    def name(self) -> str:
        return "DetLogger"

    @property
    def version(self) -> str:
        return "0.1"

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Hyperparameters come from the experiment's config (as on Determined)."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.experiment  # noqa: B018 - starts the contexts on first use
        assert core_v2.train is not None
        core_v2.train.report_training_metrics(int(step or 0), dict(metrics))

    @rank_zero_only
    def save(self) -> None:
        """Nothing buffered: each report is recorded as it comes."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        core_v2.close()
