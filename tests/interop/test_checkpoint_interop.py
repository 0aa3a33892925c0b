"""Checkpoints cross between determined==0.38.1 and lightning_bridge, in both directions.

* A checkpoint the reference writes when a trial asks for a stop is continued by the bridge, and
  the continuation ends where the reference's own uninterrupted run ends.
* A checkpoint the bridge writes is loaded by the reference's ``load_trial_from_checkpoint_path``
  and continued by the reference's own ``Trainer``.
* Checkpoints in older layouts (single-model keys, ``determined/state_dict.pth``,
  ``pedl/state_dict.pth``, ``checkpoint.pt``) continue on the bridge.

All runs happen in one process on the CPU with the same seed; each test runs in its own working
directory with the user data directory (where the reference keeps local checkpoints) beside it,
never inside it: the reference copies the working directory into every checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import pickle
import shutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from .compare import diff_values, format_report
from .harness import isolated_environment, seed_everything

pytestmark = pytest.mark.interop

reference: ModuleType = pytest.importorskip("determined.pytorch")
bridge: ModuleType = pytest.importorskip("lightning_bridge")

from .ckpt_trials import (  # noqa: E402  (needs both APIs, checked above)
    BATCH_SIZE,
    LR_DECAY,
    CkptRecorder,
    model_weights,
    optimizer_tensors,
    trial_class_for,
)

SEED = 4321
LR = 0.05
VALIDATION_EVERY = 5  # no stop point below is a multiple of it: nothing validates at the stop

# Final weights after a continuation: both sides run the same float32 operations on the same
# batches with the same dropout masks, and the weights are observed to agree to the last bit;
# 1e-6 (a few float32 ulps at |w| ~ 1) would only allow a re-associated sum.  A missing or
# repeated optimizer step, a wrong momentum buffer or learning rate, another batch or another
# dropout mask moves some weight by more than 1e-4 at lr=0.05 (a checkpoint stripped of its RNG
# state or of its momentum buffers ends more than 1.0 away).
WEIGHT_ATOL = 1e-6


@dataclasses.dataclass
class FitRecord:
    """What one ``fit()`` showed its trial, plus the weights it ended with."""

    recorder: CkptRecorder
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    lr: float

    def of(self, kind: str, name: str) -> list[dict[str, Any]]:
        return [e["args"] for e in self.recorder.events if (e["kind"], e["name"]) == (kind, name)]

    @property
    def train_calls(self) -> list[dict[str, Any]]:
        return self.of("trial", "train_batch")

    @property
    def training_metrics(self) -> list[dict[str, Any]]:
        return [a["avg_metrics"] for a in self.of("hook", "on_training_workload_end")]

    @property
    def validation_metrics(self) -> list[dict[str, Any]]:
        return [a["metrics"] for a in self.of("hook", "on_validation_end")]

    @property
    def checkpoint_dirs(self) -> list[pathlib.Path]:
        return [pathlib.Path(d) for d in self.recorder.checkpoint_dirs]

    def hooks_after_batches(self, name: str) -> list[int]:
        """For each call of hook ``name``, how many batches this fit had trained before it."""
        out: list[int] = []
        trained = 0
        for event in self.recorder.events:
            if (event["kind"], event["name"]) == ("trial", "train_batch"):
                trained += 1
            elif (event["kind"], event["name"]) == ("hook", name):
                out.append(trained)
        return out


def exp_conf(shuffle: bool) -> dict[str, Any]:
    # 44 samples in batches of 8: 6 batches per epoch, the last one of 4 samples.
    return {"data": {"n_train": 44, "n_val": 14, "shuffle": shuffle}}


def fit(
    pytorch: ModuleType,
    *,
    shuffle: bool,
    max_batches: int,
    stop_after: int | None = None,
    latest_checkpoint: str | None = None,
    checkpoint_dir: pathlib.Path | None = None,
    trial_class: type | None = None,
) -> FitRecord:
    """Train the regression trial on ``pytorch`` (inside an isolated environment); by default
    the trial class written against ``pytorch`` itself."""
    recorder = CkptRecorder()
    init_kwargs: dict[str, Any] = {}
    if pytorch is bridge:
        init_kwargs = {
            "accelerator": "cpu",
            "checkpoint_dir": checkpoint_dir or pathlib.Path("bridge_checkpoints").resolve(),
            "trainer_kwargs": {"enable_progress_bar": False, "enable_model_summary": False},
        }
    seed_everything(SEED)
    with pytorch.init(
        hparams={"global_batch_size": BATCH_SIZE, "lr": LR},
        exp_conf=exp_conf(shuffle),
        enable_tensorboard_logging=False,
        **init_kwargs,
    ) as context:
        cls = trial_class or trial_class_for(pytorch)
        trial = cls(context, recorder=recorder, stop_after=stop_after)
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=pytorch.Batch(max_batches),
            validation_period=pytorch.Batch(VALIDATION_EVERY),
            reporting_period=pytorch.Batch(1),
            checkpoint_policy="none",
            latest_checkpoint=latest_checkpoint,
        )
        return FitRecord(
            recorder=recorder,
            weights=model_weights(trial.model),
            optimizer=optimizer_tensors(trial.opt),
            lr=float(trial.opt.param_groups[0]["lr"]),
        )


def assert_weights_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=WEIGHT_ATOL, err_msg=key)


def assert_arrays_equal(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(torch.from_numpy(got[key]), torch.from_numpy(value)), key


def assert_no_diff(title: str, lines: list[str]) -> None:
    assert not lines, format_report(title, lines)


# --------------------------------------------------------------------------------------------
# Reference checkpoint -> bridge


# (data, stop point k, length N).  With sequential data the stop is mid-epoch (batch 9 of
# 6-batch epochs).  With shuffled data it is at an epoch end (batch 12): a reference checkpoint
# records the RNG at the moment it was written, not the RNG the shuffled pass in progress drew
# its order from, so after a mid-epoch stop nobody can rebuild the rest of that pass's order
# from it.  At an epoch end no pass is in progress: the next pass draws its order after the
# checkpoint, from exactly the RNG state the checkpoint holds, in the uninterrupted run too.
# (A shuffled mid-epoch stop is compared with the reference's own continuation below.)
REFERENCE_STOPS = {
    "sequential_mid_epoch": (False, 9, 16),
    "shuffled_epoch_end": (True, 12, 20),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_STOPS))
def test_bridge_continues_a_reference_checkpoint_exactly(tmp_path: pathlib.Path, case: str) -> None:
    shuffle, k, n = REFERENCE_STOPS[case]
    with isolated_environment(tmp_path / "uninterrupted"):
        expected = fit(reference, shuffle=shuffle, max_batches=n)
    with isolated_environment(tmp_path / "interrupted"):
        stopped = fit(reference, shuffle=shuffle, max_batches=n, stop_after=k)
        # The reference honoured the stop right after batch k: one checkpoint, no validation.
        assert len(stopped.train_calls) == k
        assert stopped.hooks_after_batches("on_checkpoint_write_end") == [k]
        assert all(v < k for v in stopped.hooks_after_batches("on_validation_end"))
        (ref_checkpoint,) = stopped.checkpoint_dirs
        # The bridge reads the reference's file weights-only (numpy's pickled RNG state is on
        # its allowlist) and rebuilds the trial with the weights it had at batch k.
        loaded = bridge.load_trial_from_checkpoint_path(
            str(ref_checkpoint), trial_class=trial_class_for(bridge)
        )
        assert_arrays_equal(model_weights(loaded.model), stopped.weights)
        continued = fit(
            bridge, shuffle=shuffle, max_batches=n, latest_checkpoint=str(ref_checkpoint)
        )

    # The bridge trains exactly the batches the uninterrupted run trained after batch k, with
    # the same indices, samples and learning rates.
    assert_no_diff(
        f"[{case}] train_batch calls after batch {k} differ",
        diff_values(expected.train_calls[k:], continued.train_calls, "train_batch"),
    )
    assert_no_diff(
        f"[{case}] training metrics after batch {k} differ",
        diff_values(expected.training_metrics[k:], continued.training_metrics, "training"),
    )
    validations_after_k = sum(v > k for v in expected.hooks_after_batches("on_validation_end"))
    assert validations_after_k >= 1
    assert_no_diff(
        f"[{case}] validation metrics after batch {k} differ",
        diff_values(
            expected.validation_metrics[-validations_after_k:],
            continued.validation_metrics,
            "validation",
        ),
    )
    assert_weights_close(continued.weights, expected.weights)
    assert continued.lr == pytest.approx(LR * LR_DECAY**n, rel=1e-6)
    assert continued.lr == expected.lr


# --------------------------------------------------------------------------------------------
# Bridge checkpoint -> reference


BRIDGE_STOP = 9  # mid-epoch
BRIDGE_LENGTH = 15


@dataclasses.dataclass
class BridgeCheckpoint:
    workdir: pathlib.Path
    path: pathlib.Path
    uuid: str
    at_stop: FitRecord  # the bridge run that wrote it (weights etc. at the checkpoint)


def write_bridge_checkpoint(
    workdir: pathlib.Path, trial_class: type | None = None
) -> BridgeCheckpoint:
    """The bridge trains (sequential data) with a stop at BRIDGE_STOP; its checkpoint goes where
    the reference keeps local checkpoints, so the reference finds it by its id."""
    with isolated_environment(workdir):
        storage = pathlib.Path(os.environ["XDG_DATA_HOME"]) / "determined"
        record = fit(
            bridge,
            shuffle=False,
            max_batches=BRIDGE_LENGTH,
            stop_after=BRIDGE_STOP,
            checkpoint_dir=storage,
            trial_class=trial_class,
        )
    assert len(record.train_calls) == BRIDGE_STOP
    (path,) = record.checkpoint_dirs
    assert path.parent == storage
    return BridgeCheckpoint(workdir=workdir, path=path, uuid=path.name, at_stop=record)


def _assert_loaded_bridge_weights(trial: Any, ckpt: BridgeCheckpoint) -> None:
    assert trial.context.get_hparam("lr") == LR
    assert_arrays_equal(model_weights(trial.model), ckpt.at_stop.weights)


def test_reference_loads_a_bridge_checkpoint(tmp_path: pathlib.Path) -> None:
    """``determined.pytorch.load_trial_from_checkpoint_path`` reads the bridge's checkpoint with
    its default ``torch.load`` (weights-only under torch >= 2.6) and rebuilds the trial with the
    bridge's weights and hyperparameters.

    The trial class is passed explicitly: ``load_data.json`` names the bridge's trial class, and
    the reference only imports classes derived from its own trial base class (see the next
    test for the default-argument round trip)."""
    ckpt = write_bridge_checkpoint(tmp_path)
    with isolated_environment(tmp_path):
        trial = reference.load_trial_from_checkpoint_path(
            str(ckpt.path), trial_class=trial_class_for(reference)
        )
    assert type(trial) is trial_class_for(reference)
    _assert_loaded_bridge_weights(trial, ckpt)


def test_a_determined_trial_trained_on_the_bridge_loads_with_default_arguments(
    tmp_path: pathlib.Path,
) -> None:
    """A user keeps the trial written for Determined, trains it with the bridge's Trainer, and
    loads the checkpoint back with ``determined.pytorch.load_trial_from_checkpoint_path(path)``
    and default arguments: the class named in ``load_data.json`` is Determined's, so the
    reference imports it itself."""
    ckpt = write_bridge_checkpoint(tmp_path, trial_class=trial_class_for(reference))
    with isolated_environment(tmp_path):
        trial = reference.load_trial_from_checkpoint_path(str(ckpt.path))
    # The reference re-imports the named module, so the class is compared by name.
    cls = type(trial)
    assert f"{cls.__module__}:{cls.__qualname__}" == (
        "tests.interop.ckpt_trials:ReferenceRegressionTrial"
    )
    _assert_loaded_bridge_weights(trial, ckpt)


def test_reference_trainer_continues_a_bridge_checkpoint(tmp_path: pathlib.Path) -> None:
    """The reference's own Trainer resumes from a bridge checkpoint by id and trains on.

    In local mode the reference restarts its data loader and batch_idx at 0 on resume (it is
    not an exact continuation, on any checkpoint), so what is checked is what it restored:
    weights, optimizer state, LR schedule, RNG, callback state and progress counters.
    """
    ckpt = write_bridge_checkpoint(tmp_path)
    saved = torch.load(ckpt.path / "state_dict.pth", weights_only=True)
    with isolated_environment(tmp_path):
        resumed = fit(
            reference, shuffle=False, max_batches=BRIDGE_LENGTH, latest_checkpoint=ckpt.uuid
        )

    k, n = BRIDGE_STOP, BRIDGE_LENGTH
    startup = resumed.of("hook", "on_trial_startup")
    assert [a["checkpoint_uuid"] for a in startup] == [ckpt.uuid]
    # What on_training_start saw: the bridge's weights, momentum buffers and learning rate.
    (start_weights,) = resumed.recorder.start_weights
    assert_arrays_equal(start_weights[0], ckpt.at_stop.weights)
    (start_optimizer,) = resumed.recorder.start_optimizer_tensors
    assert start_optimizer[0], "no momentum buffers restored"
    assert_arrays_equal(start_optimizer[0], ckpt.at_stop.optimizer)
    assert resumed.recorder.start_lrs == [[ckpt.at_stop.lr]]
    assert resumed.train_calls[0]["lr"] == pytest.approx(LR * LR_DECAY**k, rel=1e-6)
    # The RNG the bridge saved, including numpy's state stored with a tensor key.
    assert torch.equal(resumed.recorder.start_rng["torch"], saved["rng_state"]["cpu_rng_state"])
    np_saved = saved["rng_state"]["np_rng_state"]
    np_start = resumed.recorder.start_rng["numpy"]
    assert np_start[0] == np_saved[0]
    assert np.array_equal(np_start[1], np_saved[1].numpy().astype(np.uint32))
    assert tuple(np_start[2:]) == tuple(np_saved[2:])
    # The recording callback's state came back through load_state_dict.
    restored = resumed.of("hook", "load_state_dict")
    assert restored == [{"state_dict": saved["callbacks"]["recorder"]}]
    # Progress counters: it continues counting from the bridge's k batches and stops at n.
    assert len(resumed.train_calls) == n - k
    batches = [m["batches"] for m in resumed.training_metrics]
    assert batches == list(range(k + 1, n + 1))
    (final,) = resumed.checkpoint_dirs
    metadata = json.loads((final / "metadata.json").read_text())
    assert metadata["steps_completed"] == n
    with open(final / "trial_state.pkl", "rb") as f:
        assert pickle.load(f)["batches_trained"] == n


# --------------------------------------------------------------------------------------------
# Older layouts -> bridge


LEGACY_LAYOUTS = {
    "determined_dir": ("determined", "state_dict.pth"),
    "pedl_dir": ("pedl", "state_dict.pth"),
    "checkpoint_pt": ("checkpoint.pt",),
}


@pytest.fixture(scope="module")
def bridge_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A bridge checkpoint at a mid-epoch stop and the bridge's uninterrupted run."""
    root = tmp_path_factory.mktemp("legacy")
    with isolated_environment(root / "uninterrupted"):
        uninterrupted = fit(bridge, shuffle=False, max_batches=BRIDGE_LENGTH)
    return {"checkpoint": write_bridge_checkpoint(root / "stopped"), "expected": uninterrupted}


@pytest.mark.parametrize("layout", sorted(LEGACY_LAYOUTS))
def test_bridge_continues_legacy_layouts(
    tmp_path: pathlib.Path, bridge_runs: dict[str, Any], layout: str
) -> None:
    """A checkpoint holding the single-model keys of older Determined versions
    (``model_state_dict``, ``optimizer_state_dict``, ``lr_scheduler``) at an older file location
    continues exactly on the bridge.  It is written from the bridge checkpoint's own state, with
    the RNG state and ``trial_state.pkl`` kept so the continuation can be compared batch for
    batch (sequential data: no pass-start RNG is needed)."""
    ckpt: BridgeCheckpoint = bridge_runs["checkpoint"]
    expected: FitRecord = bridge_runs["expected"]
    payload = torch.load(ckpt.path / "state_dict.pth", weights_only=True)
    (model_state,) = payload["models_state_dict"]
    (optimizer_state,) = payload["optimizers_state_dict"]
    (scheduler_state,) = payload["lr_schedulers_state_dict"]
    legacy = tmp_path / "legacy_checkpoint"
    file = legacy.joinpath(*LEGACY_LAYOUTS[layout])
    file.parent.mkdir(parents=True)
    torch.save(
        {
            "model_state_dict": model_state,
            "optimizer_state_dict": optimizer_state,
            "lr_scheduler": scheduler_state,
            "rng_state": payload["rng_state"],
        },
        file,
    )
    shutil.copy(ckpt.path / "trial_state.pkl", legacy / "trial_state.pkl")

    with isolated_environment(tmp_path / "run"):
        continued = fit(
            bridge, shuffle=False, max_batches=BRIDGE_LENGTH, latest_checkpoint=str(legacy)
        )

    k = BRIDGE_STOP
    (start_weights,) = continued.recorder.start_weights
    assert_arrays_equal(start_weights[0], ckpt.at_stop.weights)
    (start_optimizer,) = continued.recorder.start_optimizer_tensors
    assert_arrays_equal(start_optimizer[0], ckpt.at_stop.optimizer)
    assert_no_diff(
        f"[{layout}] train_batch calls after batch {k} differ",
        diff_values(expected.train_calls[k:], continued.train_calls, "train_batch"),
    )
    assert_no_diff(
        f"[{layout}] training metrics after batch {k} differ",
        diff_values(expected.training_metrics[k:], continued.training_metrics, "training"),
    )
    assert_weights_close(continued.weights, expected.weights)


# --------------------------------------------------------------------------------------------
# Shuffled data stopped mid-epoch: each side continues each side's checkpoint


SHUFFLED_STOP = 9  # batch 3 of the second 6-batch pass: one whole pass and half of one trained
SHUFFLED_LENGTH = 15


@contextlib.contextmanager
def as_on_a_cluster(steps_completed: int) -> Iterator[None]:
    """Run the reference's ``Trainer.fit`` as a Determined cluster runs a continued trial.

    The master hands the trial the batches its checkpoint trained (``steps_completed``): the
    reference skips that many batches and counts ``batch_idx`` on from there.  Local mode has
    no master and passes 0 (it restarts the data at the first batch), so this sets what the
    master would.  The reference's own ``torch.load`` of its own checkpoint (no
    ``weights_only``) is refused under torch >= 2.6 (its numpy RNG state is no tensor): a
    Determined user there sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, as here."""
    controller = reference._PyTorchTrialController

    class ContinuedOnACluster(controller):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["steps_completed"] = steps_completed
            super().__init__(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reference, "_PyTorchTrialController", ContinuedOnACluster)
        mp.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
        yield


@dataclasses.dataclass
class ShuffledRuns:
    """Runs of the shuffled trial stopped at SHUFFLED_STOP and continued to SHUFFLED_LENGTH."""

    bridge_uninterrupted: FitRecord
    reference_on_reference: FitRecord  # the reference continues its own checkpoint
    bridge_on_reference: FitRecord  # the bridge continues the reference's checkpoint
    bridge_on_bridge: FitRecord
    reference_on_bridge: FitRecord


@pytest.fixture(scope="module")
def shuffled_runs(tmp_path_factory: pytest.TempPathFactory) -> ShuffledRuns:
    root = tmp_path_factory.mktemp("shuffled")
    k, n = SHUFFLED_STOP, SHUFFLED_LENGTH
    with isolated_environment(root / "uninterrupted"):
        uninterrupted = fit(bridge, shuffle=True, max_batches=n)
    with isolated_environment(root / "reference"):
        stopped = fit(reference, shuffle=True, max_batches=n, stop_after=k)
        assert len(stopped.train_calls) == k
        (ref_checkpoint,) = stopped.checkpoint_dirs
        with as_on_a_cluster(k):
            reference_on_reference = fit(
                reference, shuffle=True, max_batches=n, latest_checkpoint=ref_checkpoint.name
            )
        bridge_on_reference = fit(
            bridge, shuffle=True, max_batches=n, latest_checkpoint=str(ref_checkpoint)
        )
    with isolated_environment(root / "bridge"):
        storage = pathlib.Path(os.environ["XDG_DATA_HOME"]) / "determined"
        stopped = fit(bridge, shuffle=True, max_batches=n, stop_after=k, checkpoint_dir=storage)
        assert len(stopped.train_calls) == k
        (bridge_checkpoint,) = stopped.checkpoint_dirs
        bridge_on_bridge = fit(
            bridge, shuffle=True, max_batches=n, latest_checkpoint=str(bridge_checkpoint)
        )
        with as_on_a_cluster(k):
            reference_on_bridge = fit(
                reference, shuffle=True, max_batches=n, latest_checkpoint=bridge_checkpoint.name
            )
    return ShuffledRuns(
        uninterrupted,
        reference_on_reference,
        bridge_on_reference,
        bridge_on_bridge,
        reference_on_bridge,
    )


def _assert_same_continuation(title: str, expected: FitRecord, got: FitRecord) -> None:
    """The same batches (indices, samples, learning rates), per-batch losses, validations and
    final weights."""
    assert_no_diff(
        f"{title}: train_batch calls differ",
        diff_values(expected.train_calls, got.train_calls, "train_batch"),
    )
    assert_no_diff(
        f"{title}: per-batch training metrics differ",
        diff_values(expected.training_metrics, got.training_metrics, "training"),
    )
    assert_no_diff(
        f"{title}: validation metrics differ",
        diff_values(expected.validation_metrics, got.validation_metrics, "validation"),
    )
    assert_weights_close(got.weights, expected.weights)


def test_bridge_continues_a_reference_mid_epoch_checkpoint_as_the_reference_does(
    shuffled_runs: ShuffledRuns,
) -> None:
    """A checkpoint Determined wrote mid-epoch holds no record of the order the pass in progress
    was taking; Determined continues it by drawing every pass's order again from the restored
    RNG while skipping the trained batches.  The bridge continues it the same way: a run moved
    from Determined mid-epoch goes on as it would have on Determined."""
    runs, k = shuffled_runs, SHUFFLED_STOP
    expected = runs.reference_on_reference
    assert [c["batch_idx"] for c in expected.train_calls] == list(range(k, SHUFFLED_LENGTH))
    # Not the order the interrupted pass was taking: that order is lost with the checkpoint.
    assert [c["ids"] for c in expected.train_calls[:3]] != [
        c["ids"] for c in runs.bridge_uninterrupted.train_calls[k : k + 3]
    ]
    _assert_same_continuation(
        "bridge vs reference continuing the reference's checkpoint",
        expected,
        runs.bridge_on_reference,
    )


def test_a_bridge_mid_epoch_checkpoint_continues_exactly_on_the_bridge(
    shuffled_runs: ShuffledRuns,
) -> None:
    """The bridge's own checkpoint records where the pass in progress started: the bridge
    continues it exactly as its uninterrupted run went on.  Determined continues it as it
    continues its own checkpoint of the same batch (it ignores the record): one answer for
    both sides' checkpoints, which is not the uninterrupted run's."""
    runs, k = shuffled_runs, SHUFFLED_STOP
    uninterrupted = runs.bridge_uninterrupted
    bridge_on_bridge = runs.bridge_on_bridge
    assert_no_diff(
        "bridge continuing its checkpoint: train_batch calls differ from the uninterrupted run",
        diff_values(uninterrupted.train_calls[k:], bridge_on_bridge.train_calls, "train_batch"),
    )
    assert_no_diff(
        "bridge continuing its checkpoint: training metrics differ from the uninterrupted run",
        diff_values(
            uninterrupted.training_metrics[k:], bridge_on_bridge.training_metrics, "training"
        ),
    )
    assert_arrays_equal(bridge_on_bridge.weights, uninterrupted.weights)
    _assert_same_continuation(
        "reference continuing the bridge's vs its own checkpoint",
        runs.reference_on_reference,
        runs.reference_on_bridge,
    )
