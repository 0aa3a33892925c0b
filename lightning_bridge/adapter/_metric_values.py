"""Values and names of what a ported module logged, as Lightning computes and names them.

Names come from Lightning's result collection (`name`, `name_step` / `name_epoch` for a value
logged both `on_step` and `on_epoch`, `/dataloader_idx_N` with several validation loaders), so
the reported metrics hold the names `trainer.callback_metrics` holds. The per-process partial
results are combined across processes by `combine_training` / `combine_validation` (the
reducers' `cross_slot_reduce`).
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_bridge._errors import InvalidTrialError
from lightning_bridge.translation._lightning_private import _ResultCollection, forked_names

# A per-process partial result: (kind, value, count) with kind mean / sum / max / min / value.
Partial = tuple[str, Any, Any]


def scalar(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def live_items(results: _ResultCollection) -> list[Any]:
    """Every metric logged since the last reset, whatever validation loader it came from."""
    return [metric for _, metric in results.items() if not metric.has_reset]


def epoch_values(results: _ResultCollection) -> tuple[dict[str, Any], dict[str, Any]]:
    """(reported, callback) epoch-level values: both hold `name` and its forked name; the
    reported ones leave out values logged with `logger=False`."""
    reported: dict[str, Any] = {}
    callback: dict[str, Any] = {}
    for metric in live_items(results):
        if not metric.meta.on_epoch:
            continue
        value = metric.compute()
        if not isinstance(value, torch.Tensor):
            raise InvalidTrialError(
                f"The metric logged as {metric.meta.name!r} computed a "
                f"{type(value).__name__}; its compute() must return a tensor."
            )
        value = value.detach()
        for name in forked_names(results, metric, False):
            callback[name] = value
            if metric.meta.logger:
                reported[name] = value
    return reported, callback


def partial_results(results: _ResultCollection) -> dict[str, Partial]:
    """This process's partial epoch-level values (combined across processes before dividing)."""
    out: dict[str, Partial] = {}
    for metric in live_items(results):
        meta = metric.meta
        if not meta.on_epoch or not meta.logger:
            continue
        if not metric.is_tensor:
            part: Partial = ("value", scalar(metric.compute()), None)
        elif meta.is_mean_reduction:
            part = ("mean", scalar(metric.value), scalar(metric.cumulated_batch_size))
        elif meta.is_sum_reduction:
            part = ("sum", scalar(metric.value), None)
        elif meta.is_max_reduction:
            part = ("max", scalar(metric.value), None)
        else:
            part = ("min", scalar(metric.value), None)
        for name in dict.fromkeys(forked_names(results, metric, False)):
            out[name] = part
    return out


def combine_training(per_slot: list[dict[str, Any]]) -> dict[str, Any]:
    """Window means of step values and slot means of epoch values, across processes."""
    sums: dict[str, list[float]] = {}
    epoch: dict[str, list[Any]] = {}
    plain: dict[str, str] = {}
    for slot in per_slot:
        for key, (total, count) in slot["steps"].items():
            entry = sums.setdefault(key, [0.0, 0])
            entry[0] += total
            entry[1] += count
        for key, value in slot["epoch"].items():
            epoch.setdefault(key, []).append(value)
        plain.update(slot.get("plain", {}))
    out: dict[str, Any] = {k: s / c for k, (s, c) in sums.items() if c}
    for key, values in epoch.items():
        out[key] = torch.stack([torch.as_tensor(v) for v in values]).mean(dim=0)
    for forked, name in plain.items():
        # The name the value was logged under: its epoch value once the epoch ended (as in
        # callback_metrics), else the mean of its step values.
        if name not in out and forked in out:
            out[name] = out[forked]
    return out


def combine_validation(per_slot: list[dict[str, Partial]]) -> dict[str, Any]:
    """Each epoch-level value over every process's batches."""
    out: dict[str, Any] = {}
    for key in per_slot[0] if per_slot else {}:
        parts = [slot[key] for slot in per_slot if key in slot]
        kind = parts[0][0]
        values = [torch.as_tensor(p[1]) for p in parts]
        if kind == "mean":
            total = values[0]
            count = torch.as_tensor(parts[0][2])
            for value, part in zip(values[1:], parts[1:], strict=True):
                total = total + value
                count = count + torch.as_tensor(part[2])
            out[key] = total / count
        elif kind == "sum":
            out[key] = torch.stack(values).sum(dim=0)
        elif kind == "max":
            out[key] = torch.stack(values).max(dim=0).values
        elif kind == "min":
            out[key] = torch.stack(values).min(dim=0).values
        else:
            out[key] = torch.stack(values).float().mean(dim=0)
    return out
