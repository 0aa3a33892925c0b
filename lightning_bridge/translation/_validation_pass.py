"""One validation pass: the trial's evaluate outputs, checked, collected and reduced.

`evaluate_batch` trials add each batch's metrics (the same names every batch), reduced at the
end with the trial's `evaluation_reducer()`; `evaluate_full_dataset` trials set the chief's
metrics once, which are then shared with every process.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError, TrialRuntimeError
from lightning_bridge.contract._distributed import DistributedContext
from lightning_bridge.contract._reducer import reducers_for_keys
from lightning_bridge.translation._metrics import (
    check_validation_output,
    reduce_validation_metrics,
    to_numpy,
)


class ValidationPass:
    """The outputs of one validation, from its first batch to its reduced metrics."""

    def __init__(self) -> None:
        self._outputs: list[dict[str, Any]] = []
        self._keys: set[str] | None = None
        self._full: dict[str, Any] = {}

    def add_batch(self, out: Any, batch_idx: int) -> None:
        """One `evaluate_batch` result; every batch must return the same metric names."""
        metrics = check_validation_output(out, "evaluate_batch()")
        if self._keys is None:
            self._keys = set(metrics)
        elif set(metrics) != self._keys:
            raise InvalidTrialError(
                "evaluate_batch() must return the same metric names for every batch: batch "
                f"{batch_idx} returned {sorted(metrics)}, earlier batches "
                f"{sorted(self._keys)}."
            )
        self._outputs.append(to_numpy(metrics))

    def set_full(self, out: Any) -> None:
        """The `evaluate_full_dataset` result (the chief's)."""
        self._full = to_numpy(check_validation_output(out, "evaluate_full_dataset()"))

    def batch_outputs(self) -> list[dict[str, Any]]:
        """Every batch's metrics, as `on_validation_epoch_end` receives them."""
        if not self._outputs:
            raise TrialRuntimeError(
                "The validation data loader yielded no batches: give "
                "build_validation_data_loader() a non-empty dataset."
            )
        return self._outputs

    def reduce_batches(self, reducer: Any, device: torch.device) -> dict[str, Any]:
        """The batches' metrics reduced per name (and across processes)."""
        outputs = self.batch_outputs()
        keys = list(outputs[0])
        return reduce_validation_metrics(outputs, keys, reducers_for_keys(reducer, keys), device)

    def full_metrics(self, distributed: DistributedContext) -> dict[str, Any]:
        """The chief's full-dataset metrics, on every process."""
        metrics = dict(self._full)
        if distributed.size > 1:
            metrics = distributed.broadcast(metrics)
        return metrics
