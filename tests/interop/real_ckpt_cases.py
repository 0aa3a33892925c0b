"""What one API does with a checkpoint written by a released Determined version.

Shared by the reference's process (``python -m tests.interop.real_ckpt_cases OUT.json ...``,
run with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which determined==0.38.1 needs on torch >= 2.6
to read its own checkpoints) and the bridge's test, so both sides run the same cases:

* ``load``: ``load_trial_from_checkpoint_path(path)`` with no class argument -> the weights;
* ``continue``: ``fit(latest_checkpoint=path)`` up to batch 8 -> metrics, batch indices, weights;
* ``warm``: the same checkpoint marked as another trial's (trial id 7) -> a new run of 4 batches.

Every fixture checkpoint sits at an epoch boundary of unshuffled data, where Determined's local
mode (which does not skip data on resume) and the bridge's continuation read the same batches.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np


def _plain(value: Any) -> Any:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def weights(model: Any) -> dict[str, Any]:
    return {k: _plain(v) for k, v in model.state_dict().items()}


def recording(pytorch: ModuleType, trial_cls: type, events: dict[str, list[Any]]) -> type:
    """`trial_cls` with a callback recording metrics and the batch indices it trains."""

    class Record(pytorch.PyTorchCallback):  # type: ignore[name-defined,misc]
        def on_training_workload_end(self, avg_metrics: Any, batch_metrics: Any) -> None:
            events["train"].append(_plain(avg_metrics))

        def on_validation_end(self, metrics: Any) -> None:
            events["val"].append(_plain(metrics))

    class Recorded(trial_cls):  # type: ignore[misc,valid-type]
        def build_callbacks(self) -> dict[str, Any]:
            return {"record": Record()}

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            events["batch_idx"].append(batch_idx)
            return super().train_batch(batch, epoch_idx, batch_idx)

    return Recorded


@contextlib.contextmanager
def isolated(work: pathlib.Path) -> Iterator[None]:
    """cwd and the user data directory (the reference's local checkpoints) inside `work`."""
    (work / "cwd").mkdir(parents=True, exist_ok=True)
    old_cwd, old_xdg = os.getcwd(), os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(work / "xdg")
    os.chdir(work / "cwd")
    try:
        yield
    finally:
        os.chdir(old_cwd)
        if old_xdg is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = old_xdg


def as_other_trial(ckpt: pathlib.Path, dest: pathlib.Path, trial_id: int = 7) -> pathlib.Path:
    copy = pathlib.Path(shutil.copytree(ckpt, dest))
    state = pickle.loads((copy / "trial_state.pkl").read_bytes())
    (copy / "trial_state.pkl").write_bytes(pickle.dumps({**state, "trial_id": trial_id}))
    return copy


def fit_from(
    pytorch: ModuleType, trial_cls: type, ckpt: pathlib.Path, max_batches: int, work: pathlib.Path
) -> dict[str, Any]:
    events: dict[str, list[Any]] = {"train": [], "val": [], "batch_idx": []}
    # The reference's local mode restores checkpoints by id from its storage folder.
    storage = work / "xdg" / "determined"
    shutil.copytree(ckpt, storage / "source")
    ckpt_arg = "source" if pytorch.__name__.startswith("determined") else str(storage / "source")
    with isolated(work):
        with pytorch.init(exp_conf={"searcher": {"metric": "val_loss"}}) as context:
            trial = recording(pytorch, trial_cls, events)(context)
            trainer = pytorch.Trainer(trial, context)
            trainer.fit(
                max_length=pytorch.Batch(max_batches),
                validation_period=pytorch.Batch(2),
                reporting_period=pytorch.Batch(2),
                checkpoint_policy="none",
                latest_checkpoint=ckpt_arg,
            )
            events["weights"] = [weights(trial.model)]
    return events


def run_cases(
    pytorch: ModuleType, fixtures: pathlib.Path, versions: list[str], trial_classes: dict[str, type]
) -> dict[str, Any]:
    """Every case for every version; `trial_classes[version]` is its TinyTrial."""
    out: dict[str, Any] = {}
    for version in versions:
        ckpt = fixtures / version
        result: dict[str, Any] = {}
        trial = pytorch.load_trial_from_checkpoint_path(str(ckpt))
        result["load"] = weights(trial.model)
        if (ckpt / "trial_state.pkl").is_file():
            with tempfile.TemporaryDirectory() as tmp:
                work = pathlib.Path(tmp)
                cls = trial_classes[version]
                result["continue"] = fit_from(pytorch, cls, ckpt, 8, work / "continue")
                other = as_other_trial(ckpt, work / "other")
                result["warm"] = fit_from(pytorch, cls, other, 4, work / "warm")
        out[version] = result
    return out


def _reference_main() -> None:
    import determined as det
    from determined import pytorch

    out, fixtures = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    versions = sys.argv[3:]
    classes = {}
    for version in versions:
        with det.import_from_path(fixtures / version / "code"):
            import model_def  # type: ignore[import-not-found]

            classes[version] = model_def.TinyTrial
    out.write_text(json.dumps(run_cases(pytorch, fixtures, versions, classes)))


if __name__ == "__main__":
    _reference_main()
