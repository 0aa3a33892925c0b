"""Two processes under torchrun train the same trial on the reference and on the bridge alike.

The trial (SGD with momentum, a per-batch LR schedule, shuffled data, dropout) runs under
``python -m torch.distributed.run --nproc_per_node=2`` once on ``determined.pytorch`` and twice
on ``lightning_bridge``: once with the process group created by the script and its context
passed to ``init()`` (the way the reference runs off-cluster), once leaving the bridge to detect
the torchrun launch.  Each run has its own working directory and user data directory.  What each
rank's trial observed (callbacks, metrics, the samples of every batch, the final weights) must
be the same on both sides.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("determined.pytorch")
pytest.importorskip("lightning_bridge")

pytestmark = pytest.mark.interop

REPO = pathlib.Path(__file__).resolve().parents[2]
RANKS = (0, 1)

# Both sides feed each rank the same 4 samples per step, run the same float32 forward and
# backward passes, and average the two ranks' gradients with one gloo all-reduce of two operands
# (a two-term sum is exact up to the one rounding of the result, whatever the order), so the
# weights are expected to agree bit for bit.  rtol=1e-6 / atol=1e-7 only tolerates re-associated
# sums; one missing, extra or reordered optimizer step (lr ~ 0.05) moves weights by > 1e-4.
WEIGHT_RTOL = 1e-6
WEIGHT_ATOL = 1e-7
METRIC_RTOL = 1e-5

Record = dict[str, Any]
RUNS = {
    "reference": ("determined", "process_group", "sgd_dropout"),
    "bridge": ("lightning_bridge", "process_group", "sgd_dropout"),
    "bridge_auto": ("lightning_bridge", "auto", "sgd_dropout"),
    "reference_two_models": ("determined", "process_group", "two_models"),
    "bridge_two_models": ("lightning_bridge", "auto", "two_models"),
}


def _torchrun(api: str, launch: str, scenario: str, workdir: pathlib.Path) -> list[Record]:
    workdir.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(var, None)
    env.pop("MASTER_PORT", None)
    env.pop("USE_TORCH_DISTRIBUTED", None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--standalone", "-m", "tests.interop.ddp_script",
        "--api", api, "--launch", launch, "--scenario", scenario,
        "--workdir", str(workdir), "--out", str(workdir / "record"),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{api} ({launch}) failed:\n{done.stdout}\n{done.stderr}"
    return [json.loads((workdir / f"record.{rank}.json").read_text()) for rank in RANKS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[Record]]:
    """Each run happens once per module, on first use; the records of both ranks are kept."""
    root = tmp_path_factory.mktemp("ddp")
    cache: dict[str, list[Record] | BaseException] = {}

    def get(name: str) -> list[Record]:
        if name not in cache:
            api, launch, scenario = RUNS[name]
            try:
                cache[name] = _torchrun(api, launch, scenario, root / name)
            except BaseException as exc:  # re-raised for every test that needs this run
                cache[name] = exc
        result = cache[name]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


def _bare_weights(record: Record) -> dict[str, dict[str, np.ndarray]]:
    # The reference's wrap_model() wraps the model in DistributedDataParallel when several
    # processes train, so its state_dict keys carry a "module." prefix; the values are compared
    # here, under the parameters' own names.  (The keys are checked by their own test below.)
    return {
        model: {key.removeprefix("module."): np.asarray(v) for key, v in weights.items()}
        for model, weights in record["weights"].items()
    }


def _assert_metrics_close(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for key, value in w.items():
            if isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=METRIC_RTOL), key
            else:
                assert g[key] == value, key


@pytest.mark.parametrize("side", ["bridge", "bridge_auto"])
@pytest.mark.parametrize("rank", RANKS)
def test_same_callbacks_metrics_and_batches(
    runs: Callable[[str], list[Record]], side: str, rank: int
) -> None:
    want = runs("reference")[rank]
    got = runs(side)[rank]
    assert got["hook_names"] == want["hook_names"]
    assert got["train_indices"] == want["train_indices"]
    assert got["train_ids"] == want["train_ids"]
    assert got["eval_ids"] == want["eval_ids"]
    _assert_metrics_close(got["training_metrics"], want["training_metrics"])
    _assert_metrics_close(got["validation_metrics"], want["validation_metrics"])
    for g, w in zip(got["final_lrs"].values(), want["final_lrs"].values(), strict=True):
        np.testing.assert_allclose(g, w, rtol=METRIC_RTOL)


@pytest.mark.parametrize("side", ["bridge", "bridge_auto"])
@pytest.mark.parametrize("rank", RANKS)
def test_same_final_weights(runs: Callable[[str], list[Record]], side: str, rank: int) -> None:
    want = _bare_weights(runs("reference")[rank])
    got = _bare_weights(runs(side)[rank])
    assert sorted(got) == sorted(want)
    for model, weights in want.items():
        assert list(got[model]) == list(weights)
        for key, value in weights.items():
            np.testing.assert_allclose(
                got[model][key], value, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, err_msg=key
            )


@pytest.mark.parametrize("side", ["reference", "bridge", "bridge_auto"])
def test_ranks_end_with_the_same_weights(runs: Callable[[str], list[Record]], side: str) -> None:
    first, second = (_bare_weights(record) for record in runs(side))
    for model, weights in first.items():
        for key, value in weights.items():
            np.testing.assert_array_equal(second[model][key], value, err_msg=key)


def test_ranks_see_disjoint_samples(runs: Callable[[str], list[Record]]) -> None:
    """The reference splits every global batch of 8 into two halves of 4 (one per rank)."""
    first, second = runs("reference")
    for a, b in zip(first["train_ids"], second["train_ids"], strict=True):
        assert len(a) == len(b) == 4
        assert not set(a) & set(b)


@pytest.mark.parametrize("side", ["bridge", "bridge_auto"])
def test_models_are_not_wrapped_in_ddp_by_the_trial(
    runs: Callable[[str], list[Record]], side: str
) -> None:
    # Lightning's strategy wraps the whole TrialModule, so wrap_model() hands the trial its own
    # module: state_dict keys carry no "module." prefix (Determined's DDP wrapper adds one).
    # Checkpoints load either way: both sides strip or add the prefix when loading.
    reference_keys = runs("reference")[0]["state_dict_keys"]
    want = {
        name: [k.removeprefix("module.") for k in keys] for name, keys in reference_keys.items()
    }
    got = runs(side)[0]["state_dict_keys"]
    assert got == want
    assert not any(k.startswith("module.") for keys in got.values() for k in keys)


@pytest.mark.parametrize("rank", RANKS)
def test_two_models_stepped_separately_match_the_reference(
    runs: Callable[[str], list[Record]], rank: int
) -> None:
    """Determined wraps each model in its own DistributedDataParallel; Lightning wraps the whole
    TrialModule once (with unused-parameter detection for several models). Two models, each
    backward touching one of them, with aggregation_frequency=2 and clipping, end alike."""
    want = runs("reference_two_models")[rank]
    got = runs("bridge_two_models")[rank]
    assert got["hook_names"] == want["hook_names"]
    assert got["train_ids"] == want["train_ids"]
    _assert_metrics_close(got["training_metrics"], want["training_metrics"])
    _assert_metrics_close(got["validation_metrics"], want["validation_metrics"])
    want_weights, got_weights = _bare_weights(want), _bare_weights(got)
    for model, weights in want_weights.items():
        for key, value in weights.items():
            np.testing.assert_allclose(
                got_weights[model][key], value, rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, err_msg=key
            )
