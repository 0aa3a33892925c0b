"""The same trials on determined==0.38.1 and on lightning_bridge must be indistinguishable.

Each scenario of ``trials.SCENARIOS`` runs once on each side (same process, same seed, CPU) and
the two recordings are compared aspect by aspect, so a failure names what differs: the callback
sequence, the order of calls into user code, the metrics, the weights, the indices or the
checkpoint files.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from .compare import diff_event_sequences, diff_values, format_report
from .harness import RunRecord, run_trial
from .trials import SCENARIOS

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
bridge: ModuleType = pytest.importorskip("lightning_bridge")

SCENARIO_NAMES = sorted(SCENARIOS)

# Final weights: both sides apply the same float32 operations to the same batches in the same
# order, so the weights are expected to agree bit for bit.  rtol=1e-6 / atol=1e-7 is a few ulps of
# float32 at the magnitudes involved (|w| < 10) and only tolerates re-associated sums; a single
# missing, extra or reordered optimizer step (lr >= 1e-2 here) moves weights by > 1e-4.
WEIGHT_RTOL = 1e-6
WEIGHT_ATOL = 1e-7

Pair = tuple[RunRecord, RunRecord]


@pytest.fixture(scope="module")
def run_pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Pair]:
    """Run a scenario on both sides once per module; later tests reuse the recordings."""
    cache: dict[str, Pair | BaseException] = {}

    def get(name: str) -> Pair:
        if name not in cache:
            root = pathlib.Path(tmp_path_factory.mktemp(name))
            expected = run_trial(reference, SCENARIOS[name], root / "reference")
            try:
                cache[name] = (expected, run_trial(bridge, SCENARIOS[name], root / "bridge"))
            except Exception as exc:  # re-raised for every test of the scenario
                cache[name] = exc
        result = cache[name]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


def _assert_no_diff(title: str, lines: list[str]) -> None:
    assert not lines, format_report(title, lines)


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_callback_sequence(run_pair: Callable[[str], Pair], name: str) -> None:
    """Every PyTorchCallback hook fires in the reference's order with the reference's args."""
    expected, got = run_pair(name)
    _assert_no_diff(
        f"[{name}] callback hooks differ", diff_event_sequences(expected.hooks, got.hooks)
    )


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_calls_into_user_code(run_pair: Callable[[str], Pair], name: str) -> None:
    """train_batch / evaluate_* / clip_grads / reducer calls interleave with hooks as in the
    reference, and each receives the same batch (sample ids), model mode, weights and LR."""
    expected, got = run_pair(name)
    _assert_no_diff(
        f"[{name}] calls into user code differ", diff_event_sequences(expected.events, got.events)
    )


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_training_metrics(run_pair: Callable[[str], Pair], name: str) -> None:
    expected, got = run_pair(name)
    _assert_no_diff(
        f"[{name}] training metrics (on_training_workload_end avg_metrics) differ",
        diff_values(expected.training_metrics, got.training_metrics, "training"),
    )


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_validation_metrics(run_pair: Callable[[str], Pair], name: str) -> None:
    expected, got = run_pair(name)
    _assert_no_diff(
        f"[{name}] validation metrics (on_validation_end) differ",
        diff_values(expected.validation_metrics, got.validation_metrics, "validation"),
    )


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_batch_indices(run_pair: Callable[[str], Pair], name: str) -> None:
    expected, got = run_pair(name)
    assert got.train_indices == expected.train_indices, (
        f"[{name}] (batch_idx, epoch_idx) passed to train_batch differ:\n"
        f"reference: {expected.train_indices}\nbridge:    {got.train_indices}"
    )


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_final_weights(run_pair: Callable[[str], Pair], name: str) -> None:
    expected, got = run_pair(name)
    assert sorted(got.weights) == sorted(expected.weights)
    for model_name, state in expected.weights.items():
        assert sorted(got.weights[model_name]) == sorted(state), model_name
        for key, value in state.items():
            np.testing.assert_allclose(
                got.weights[model_name][key],
                value,
                rtol=WEIGHT_RTOL,
                atol=WEIGHT_ATOL,
                err_msg=f"[{name}] final weights of {model_name}.{key}",
            )
    _assert_no_diff(
        f"[{name}] final learning rates differ",
        diff_values(expected.final_lrs, got.final_lrs, "lr"),
    )


def _outside_code_copy(files: list[str]) -> list[str]:
    # The reference copies the working directory into "code/" of every checkpoint; what lands
    # there depends on the machine, so only the checkpoint's own files are compared.
    return [f for f in files if not f.startswith("code/")]


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_checkpoint_files(run_pair: Callable[[str], Pair], name: str) -> None:
    """Every checkpoint ends up with Determined's files, in a directory named by the uuid that
    on_checkpoint_upload_end reports.  (Where the directories live is the bridge's choice: the
    reference's default is the user data directory; it is recorded but not compared.)"""
    expected, got = run_pair(name)
    _assert_no_diff(
        f"[{name}] checkpoint directories differ",
        diff_values(
            [_outside_code_copy(f) for f in expected.checkpoint_files],
            [_outside_code_copy(f) for f in got.checkpoint_files],
            "files",
        )
        + diff_values(
            [loc["named_by_uuid"] for loc in expected.checkpoint_locations],
            [loc["named_by_uuid"] for loc in got.checkpoint_locations],
            "named_by_uuid",
        ),
    )
