"""A ported LightningModule trains the same on lightning.Trainer, the bridge and Determined.

`lightning_trial(Module)` on `lightning_bridge.Trainer` and `lightning_trial(Module,
base=determined.pytorch.PyTorchTrial)` on Determined's own `Trainer` run two epochs,
validating after each, and must end with the weights `lightning.Trainer(max_epochs=2)` gives
the module itself (automatic and manual optimization, LR schedulers, torchmetrics metrics),
and report the validation values Lightning logged.
"""

from __future__ import annotations

import pathlib

import pytest

reference = pytest.importorskip("determined.pytorch")
bridge = pytest.importorskip("lightning_bridge")

from tests._adapter_modules import (  # noqa: E402
    BRIDGE_INIT,
    ManualNet,
    Net,
    PlateauNet,
    max_weight_diff,
    run_lightning,
    run_trial,
    weights,
)

pytestmark = pytest.mark.interop

HPARAMS = {"global_batch_size": 8, "lr": 0.1}
VAL_KEYS = ("val_loss", "val_acc", "val_max", "val_count")


@pytest.mark.parametrize("module_cls", [Net, ManualNet, PlateauNet])
def test_same_weights_on_lightning_bridge_and_determined(
    module_cls: type, reference_workdir: pathlib.Path
) -> None:

    expected = module_cls(lr=0.1, batch_size=8)
    lightning_val = run_lightning(expected, epochs=2)
    ours, _, ours_val = run_trial(
        bridge, bridge.lightning_trial(module_cls), HPARAMS, **BRIDGE_INIT
    )
    ref_cls = bridge.lightning_trial(module_cls, base=reference.PyTorchTrial)
    ref, _, ref_val = run_trial(reference, ref_cls, HPARAMS)

    bridge_diff = max_weight_diff(weights(ours.lightning_module), weights(expected))
    reference_diff = max_weight_diff(weights(ref.lightning_module), weights(expected))
    print(
        f"{module_cls.__name__}: max |w - w_lightning| bridge {bridge_diff:.3g}, "
        f"determined {reference_diff:.3g}"
    )
    assert bridge_diff < 1e-5
    assert reference_diff < 1e-5
    # The weights moved: a run that skipped training would not pass.
    start = weights(module_cls(lr=0.1, batch_size=8))
    assert max_weight_diff(start, weights(expected)) > 1e-2
    assert len(ours_val) == len(ref_val) == len(lightning_val) == 2
    for theirs, got_bridge, got_ref in zip(lightning_val, ours_val, ref_val, strict=True):
        for key in VAL_KEYS:
            assert float(got_bridge[key]) == pytest.approx(theirs[key], rel=1e-5), key
            assert float(got_ref[key]) == pytest.approx(theirs[key], rel=1e-5), key
