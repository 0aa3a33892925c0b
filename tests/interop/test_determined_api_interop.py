"""The `determined` mapping against Determined 0.38.1 itself: the same `determined.pytorch`
names, the same `LOG_FORMAT`, a `CheckpointLoadContext` that answers the same."""

from __future__ import annotations

import types

import pytest

import lightning_bridge
from lightning_bridge.contract import _import_map

pytestmark = pytest.mark.interop


def test_mapped_pytorch_holds_determineds_public_names() -> None:
    import determined
    import determined.pytorch as real

    public = {
        name
        for name in dir(real)
        if not name.startswith("_")
        and (name == "samplers" or not isinstance(getattr(real, name), types.ModuleType))
    }
    assert set(_import_map.PYTORCH_NAMES) == public
    assert _import_map.LOG_FORMAT == determined.LOG_FORMAT
    real_samplers = {n for n in dir(real.samplers) if n[0].isupper() and n.endswith("Sampler")}
    assert real_samplers <= set(lightning_bridge.samplers.__all__)


def test_checkpoint_load_context_answers_as_determineds() -> None:
    from determined import pytorch as real

    for context in (
        real.CheckpointLoadContext(hparams={"k": 1}, exp_conf={"name": "x"}),
        lightning_bridge.CheckpointLoadContext(hparams={"k": 1}, exp_conf={"name": "x"}),
    ):
        assert context.get_trial_seed() == 0
        assert context.distributed.get_size() == 1 and context.distributed.get_rank() == 0
        assert context.get_hparams() == {"k": 1}
        assert context.get_experiment_config() == {"name": "x"}
