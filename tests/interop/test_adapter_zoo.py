"""Real-world LightningModules train to lightning.Trainer's weights on both trial trainers.

Every case of `tests/_zoo.py` (tutorial classifiers with OneCycleLR, a GAN and an autoencoder
without validation, EarlyStopping / ModelCheckpoint callbacks, a `pytorch_lightning` module,
gradient accumulation three ways, SWA, LearningRateMonitor and a user callback, two validation
loaders, Lightning's epoch-end order, validation every other epoch, bf16 and float64) is
trained by `lightning.Trainer` (or `pytorch_lightning.Trainer`), by
`lightning_trial(...)` on `lightning_bridge.Trainer`, and by `lightning_trial(...,
base=determined.pytorch.PyTorchTrial)` on Determined's own Trainer. On the CPU the final
weights are bit for bit Lightning's on both, with as many optimizer steps and validations,
and the validation values Lightning computed.
"""

from __future__ import annotations

import pathlib

import pytest

reference = pytest.importorskip("determined.pytorch")

import lightning_bridge  # noqa: E402
from tests._zoo import CASES, Case  # noqa: E402
from tests._zoo_runner import Run, epoch_len, max_diff, run_lightning, run_trial, weights  # noqa: E402

pytestmark = pytest.mark.interop


def _check_validations(case: Case, lightning: Run, trial: Run) -> None:
    if lightning.validations:
        assert len(trial.validations) == len(lightning.validations)
        for theirs, ours in zip(lightning.validations, trial.validations, strict=True):
            wanted = {k: v for k, v in theirs.items() if k.startswith("val_")}
            assert wanted, "Lightning validated something"
            assert {k: ours[k] for k in wanted} == pytest.approx(wanted, rel=1e-6, abs=1e-7)
    else:
        # No validation_step: each trial validation reports the last epoch's training values.
        assert len(trial.validations) == len(lightning.step_means) == case.epochs
        for epoch, ours in enumerate(trial.validations):
            theirs = lightning.step_means[epoch][case.metric]
            assert ours[case.metric] == pytest.approx(theirs, rel=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_module_trains_to_lightnings_weights_on_both_trainers(
    case: Case, reference_workdir: pathlib.Path
) -> None:
    lightning = run_lightning(case)
    bridge = run_trial(lightning_bridge, case)
    determined = run_trial(reference, case)
    diffs = {
        "bridge": max_diff(bridge.weights, lightning.weights),
        "determined": max_diff(determined.weights, lightning.weights),
    }
    print(f"{case.name}: max |w - w_lightning| {diffs}")
    assert diffs == {"bridge": 0.0, "determined": 0.0}
    start = weights(case.module(**case.constructor_hparams(case.module)))
    assert max_diff(start, lightning.weights) > 1e-3, "the weights moved"
    if case.name == "early_stopping":
        # EarlyStopping ended all three runs at the same epoch, before the length.
        assert lightning.global_step < case.epochs * epoch_len(case)
    assert bridge.global_step == determined.global_step == lightning.global_step
    _check_validations(case, lightning, bridge)
    _check_validations(case, lightning, determined)
