"""The parity scenarios really exercise what they claim, checked on the reference alone.

These tests need determined==0.38.1 but not lightning_bridge.  They pin down the reference
behaviour each scenario is meant to probe (aggregation skips optimizer steps, a stop request
ends the fit early, test mode trains one batch, schedules fire where asked, ...), so that a
passing parity test means something, and they check that a run is reproducible in-process,
which the parity comparison relies on.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from .compare import diff_event_sequences, format_report
from .harness import RunRecord, run_trial
from .trials import SCENARIOS

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], RunRecord]:
    cache: dict[str, RunRecord] = {}

    def get(name: str) -> RunRecord:
        if name not in cache:
            workdir = pathlib.Path(tmp_path_factory.mktemp(f"ref-{name}"))
            cache[name] = run_trial(reference, SCENARIOS[name], workdir)
        return cache[name]

    return get


def batches_before(record: RunRecord, name: str, kind: str = "hook") -> list[int]:
    """For each event ``name``, how many ``train_batch`` calls preceded it."""
    out: list[int] = []
    trained = 0
    for event in record.events:
        if event["kind"] == "trial" and event["name"] == "train_batch":
            trained += 1
        elif event["kind"] == kind and event["name"] == name:
            out.append(trained)
    return out


def batch_metric(record: RunRecord, key: str) -> list[Any]:
    """A per-batch training metric, across all workloads, in batch order."""
    return [
        m[key]
        for args in record.hook_args("on_training_workload_end")
        for m in args["batch_metrics"]
    ]


def changed_after(values: list[float]) -> list[int]:
    """Indices ``i`` such that ``values[i + 1] != values[i]``."""
    return [i for i in range(len(values) - 1) if values[i + 1] != values[i]]


def test_every_scenario_is_reproducible(tmp_path: pathlib.Path) -> None:
    """Two runs of a scenario in one process record identical events and weights."""
    for name, scenario in SCENARIOS.items():
        first = run_trial(reference, scenario, tmp_path / name / "a")
        second = run_trial(reference, scenario, tmp_path / name / "b")
        lines = diff_event_sequences(first.events, second.events)
        assert not lines, format_report(f"[{name}] not reproducible", lines)
        for model, state in first.weights.items():
            for key, value in state.items():
                np.testing.assert_array_equal(second.weights[model][key], value)


def test_sgd_dropout(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("sgd_dropout")
    epoch_len = math.ceil(44 / 8)
    assert rec.train_indices == [(i, i // epoch_len) for i in range(3 * epoch_len)]
    # Shuffled: every epoch covers the training set once, in a different, non-sorted order.
    ids = [a["ids"] for a in rec.trial_calls("train_batch")]
    epochs: list[list[int]] = [
        [i for batch in ids[e * epoch_len : (e + 1) * epoch_len] for i in batch] for e in range(3)
    ]
    for order in epochs:
        assert sorted(order) == list(range(44))
        assert order != sorted(order)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    # Dropout is active in training only; validation runs without autograd.
    assert all(a["training"] and a["grad_enabled"] for a in rec.trial_calls("train_batch"))
    assert all(
        not a["training"] and not a["grad_enabled"] for a in rec.trial_calls("evaluate_batch")
    )
    # The LR schedule steps after every batch.
    lrs = batch_metric(rec, "lr")
    assert lrs == pytest.approx([0.05 * 0.97**i for i in range(18)])
    # Periods in batches cut across epochs: validation every 4, checkpoint every 7, reports
    # every 5, plus the final validation; checkpoint_policy falls back to "all" locally.
    assert batches_before(rec, "on_validation_end") == [4, 8, 12, 16, 18]
    assert batches_before(rec, "on_checkpoint_write_end") == [4, 7, 8, 12, 14, 16, 18]
    assert batches_before(rec, "on_training_workload_end") == [4, 5, 7, 8, 10, 12, 14, 15, 16, 18]
    # The dict passed to on_validation_end is recorded before the reference adds to it.
    assert all("batches" not in m for m in rec.validation_metrics)
    assert all({"batches", "epochs"} <= set(m) for m in rec.training_metrics)


def test_two_models_aggregation(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("two_models")
    calls = rec.trial_calls("train_batch")
    assert rec.train_indices == [(i, i // 7) for i in range(21)]
    assert {a["batch_type"] for a in calls} == {"PairBatch"}
    assert rec.counters.get("get_batch_length", 0) > 0
    # aggregation_frequency=2: both optimizers step only after every second batch.
    stepping = [i for i in range(20) if (i + 1) % 2 == 0]
    assert changed_after([a["param_sum_a"] for a in calls]) == stepping
    assert changed_after([a["param_sum_b"] for a in calls]) == stepping
    # clip_grads runs on the stepping batches only, for the clipped optimizer only.
    clips = rec.trial_calls("clip_grads")
    assert [c["batch_idx"] for c in clips] == stepping
    assert all(c["n_params"] == 2 for c in clips)
    # STEP_EVERY_EPOCH with aggregation: the scheduler steps on the last optimizer step of an
    # epoch (the next optimizer step falls into the next epoch), here after batches 5, 13, 19.
    lr_a = batch_metric(rec, "lr_a")
    epoch_steps = [i for i in stepping if i // 7 != (i + 2) // 7]
    assert epoch_steps == [5, 13, 19]
    assert changed_after(lr_a) == [i for i in epoch_steps if i < 20]
    assert rec.final_lrs["opt_a"][0] == pytest.approx(0.2 * 0.5 ** len(epoch_steps))
    # MANUAL_STEP: only the trial's own calls move the second LR.
    manual = [a["batch_idx"] for a in rec.trial_calls("train_batch") if a["batch_idx"] % 4 == 3]
    assert changed_after(batch_metric(rec, "lr_b")) == [i for i in manual if i < 20]
    # Validation every epoch; checkpoint_policy="none": checkpoints at 10, 20 and at the end.
    assert batches_before(rec, "on_validation_end") == [7, 14, 21]
    assert batches_before(rec, "on_checkpoint_write_end") == [10, 20, 21]
    assert [a["batch_idx"] for a in rec.trial_calls("evaluate_batch")] == [0, 1, 2] * 3


def test_reducers(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("reducers")
    workloads = rec.hook_args("on_training_workload_end")
    for args in workloads:
        avg = args["avg_metrics"]
        assert {"loss", "train_median_margin", "updates"} <= set(avg)
        assert not {"val_custom_acc", "val_class0_share"} & set(avg)
        # The reducer used in both phases is reset at every workload start.
        assert avg["updates"] == len(args["batch_metrics"])
        # A non-scalar training metric is averaged over all its elements and batches.
        vectors = [m["mean_logits"] for m in args["batch_metrics"]]
        assert all(len(v) == 3 for v in vectors)
        assert avg["mean_logits"] == pytest.approx(float(np.mean(vectors)))
    outputs = [a["outputs"] for a in rec.hook_args("on_validation_epoch_end")]
    assert len(outputs) == len(rec.validation_metrics) == 3
    for out, metrics in zip(outputs, rec.validation_metrics, strict=True):
        assert "train_median_margin" not in metrics
        assert {"val_custom_acc", "val_class0_share"} <= set(metrics)
        assert metrics["updates"] == len(out) == 4
        assert metrics["v_avg"] == pytest.approx(np.mean([o["v_avg"] for o in out]))
        assert metrics["v_sum"] == sum(o["v_sum"] for o in out)
        assert metrics["v_max"] == pytest.approx(max(o["v_max"] for o in out))
        assert metrics["v_min"] == pytest.approx(min(o["v_min"] for o in out))
        # Reducer.AVG of a non-scalar metric: one scalar, the mean over every element.
        assert metrics["v_vec"] == pytest.approx(float(np.mean([o["v_vec"] for o in out])))
    # MetricReducer: per-slot then cross-slot reduction once per validation, never in training.
    names = [e["name"] for e in rec.events if e["name"].startswith("reducer_")]
    assert names.count("reducer_cross_slot_reduce") == 3
    assert names.count("reducer_per_slot_reduce") == 3
    # STEP_EVERY_OPTIMIZER_STEP with frequency=2: the LR moves after every second batch.
    lrs = [a["lr"] for a in rec.trial_calls("train_batch")]
    assert lrs == pytest.approx([0.05 * 0.8 ** (i // 2) for i in range(14)])
    calls = rec.trial_calls("train_batch")
    assert [a["is_epoch_start"] for a in calls] == [i % 4 == 0 for i in range(14)]
    assert [a["is_epoch_end"] for a in calls] == [i % 4 == 3 for i in range(14)]


def test_full_dataset_schedules(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("full_dataset")
    assert len(rec.trial_calls("train_batch")) == 12
    # Step-zero validation, then the scheduled ones, then the final one.
    assert batches_before(rec, "on_validation_end") == [0, 3, 7, 11, 12]
    assert batches_before(rec, "on_checkpoint_write_end") == [3, 5, 7, 10, 11, 12]
    calls = rec.trial_calls("evaluate_full_dataset")
    assert len(calls) == 5
    assert all(c["ids"] == list(range(12)) for c in calls)
    assert all(not c["training"] and not c["grad_enabled"] for c in calls)
    assert all(m["val_count"] == 12 for m in rec.validation_metrics)
    # Workloads end at validations, checkpoints, the end of the 8-batch epoch and the end.
    assert batches_before(rec, "on_training_workload_end") == [3, 5, 7, 8, 10, 11, 12]
    assert not [e for e in rec.hooks if e["name"].startswith("on_validation_epoch")]


def test_test_mode(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("test_mode")
    assert rec.train_indices == [(0, 0)]
    assert len(rec.trial_calls("evaluate_batch")) == 1
    assert batches_before(rec, "on_validation_end") == [1]
    assert batches_before(rec, "on_checkpoint_write_end") == [1]


def test_stop_requested(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("stop_requested")
    # Asked for at the end of epoch 1 (5 batches per epoch, drop_last) ...
    assert batches_before(rec, "stop_requested", kind="note") == [10]
    # ... honoured at the next workload boundary (batch 12), far before max_length (50).
    assert rec.train_indices == [(i, i // 5) for i in range(12)]
    assert batches_before(rec, "on_validation_end") == [6, 12]
    assert batches_before(rec, "on_checkpoint_write_end") == [12]
    assert rec.hooks[-1]["name"] == "on_trial_shutdown"
    lrs = [a["lr"] for a in rec.trial_calls("train_batch")]
    assert lrs == pytest.approx([0.05 * 0.9 ** (i // 3) for i in range(12)])


def test_aggregation3_schedulers(ref_run: Callable[[str], RunRecord]) -> None:
    rec = ref_run("aggregation3")
    calls = rec.trial_calls("train_batch")
    assert len(calls) == 20
    stepping = [i for i in range(20) if (i + 1) % 3 == 0]
    assert changed_after([a["param_sum"] for a in calls]) == stepping
    # Learning rate before each batch: 0.9 per STEP_EVERY_OPTIMIZER_STEP step (on stepping
    # batches whose (batch + 1) is a multiple of 2), 0.8 per epoch step (last optimizer step of
    # an epoch), 0.95 per STEP_EVERY_BATCH step (every 2nd batch, applied at optimizer steps).
    lr = 0.05
    expected = []
    for i in range(20):
        expected.append(lr)
        if i in stepping:
            if (i + 1) % 2 == 0:
                lr *= 0.9
            if i // 7 != (i + 3) // 7:
                lr *= 0.8
            lr *= 0.95 ** sum(1 for j in range(i - 2, i + 1) if (j + 1) % 2 == 0)
    assert [a["lr"] for a in calls] == pytest.approx(expected)
    # train_batch returned a bare tensor: it is reported as "loss".
    assert all(set(m) == {"loss", "batches", "epochs"} for m in rec.training_metrics)
    assert batches_before(rec, "on_validation_end") == [7, 14, 20]
