"""Determined's Core API (`det.core.init()`) off `lightning-bridge run`: a plain
`python3 train.py` reports, asks the searcher and the preemption signal, and stores
checkpoints as Determined's off-cluster mode does (tests/interop compares the two)."""

from __future__ import annotations

import json
import pathlib

import pytest

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.contract import _import_map
from tests._core_api_runs import reports, run_script, seen, stored


def test_an_off_cluster_script_reports_and_stores_its_checkpoints(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out.json"
    result = run_script("offcluster.py", [str(tmp_path / "ck"), str(out)], tmp_path)
    assert reports(result.stdout) == [
        "report_training_metrics(steps_completed=1, metrics={'loss': 1.5, 'step': 1})",
        "report_training_metrics(steps_completed=2, metrics={'loss': 2.75, 'step': 2})",
        "report_training_metrics(steps_completed=3, metrics={'loss': 4.375, 'step': 3})",
        "report_validation_metrics(steps_completed=3, metrics={'val_loss': 1.4583333333333333})",
        "report_progress with progress=1.0",
        "progress report: 1/1",
        "SearcherOperation Complete: searcher_metric=1.4583333333333333",
        "status: storing",
    ]
    what = seen(out)
    # One searcher operation of length 1, never preempted, a single process, no cluster.
    assert what["ops"] == [1]
    assert what["preempt"] == [False, False, False]
    assert what["rank"] == [0, 1]
    assert what["context"] and what["cluster_info"]
    assert what["best"] is None
    files = stored(tmp_path / "ck")
    assert sorted(files) == sorted([what["stored"], what["uploaded"]])  # the deleted one is gone
    assert files[what["stored"]] == {
        "metadata.json": json.dumps({"steps_completed": 3, "w": 4.375}, indent=2).encode(),
        "nested/blob.bin": bytes(range(16)),
        "weight.txt": b"4.375",
    }
    assert what["restored_weight"] == "4.375"
    # upload(selector=) keeps the selected files; metadata.json marks the checkpoint complete.
    assert files[what["uploaded"]] == {
        "deep/also.txt": b"also kept",
        "keep.txt": b"kept",
        "metadata.json": json.dumps({"steps_completed": 3}, indent=2).encode(),
    }
    assert what["downloaded"] == ["deep", "deep/also.txt", "keep.txt", "metadata.json"]


def test_checkpoint_storage_defaults_to_the_user_data_folder(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out.json"
    run_script("offcluster.py", ["", str(out)], tmp_path)
    what = seen(out)
    assert sorted(stored(tmp_path / "xdg" / "determined")) == sorted(
        [what["stored"], what["uploaded"]]
    )


@pytest.fixture()
def mapped() -> object:
    assert _import_map.install(force=True)
    yield
    _import_map.uninstall()


@pytest.mark.parametrize(
    ("storage", "says"),
    [
        ("ftp://host/ckpts", "expected a path, an s3:// or gs:// URI"),
        ({"type": "shared_fs", "host_path": "/tmp"}, "named by its path as a string"),
        (3, "not int"),
    ],
)
def test_a_bad_checkpoint_storage_is_refused_by_name(
    mapped: None, storage: object, says: str
) -> None:
    import determined as det  # type: ignore[import-not-found]

    with pytest.raises(InvalidArgumentError) as info:
        det.core.init(checkpoint_storage=storage)
    assert says in str(info.value)
    assert "checkpoint_storage" in str(info.value)


def test_the_core_names_and_private_paths_are_the_bridges(mapped: None) -> None:
    import determined as det
    from determined.core._context import Context  # type: ignore[import-not-found]
    from determined.core._tensorboard_mode import (  # type: ignore[import-not-found]
        TensorboardMode,
    )

    import lightning_bridge.core as core

    assert det.core.init is core.init
    assert Context is core.Context
    assert TensorboardMode is core.TensorboardMode is det.core.TensorboardMode
    assert [m.value for m in det.core.PreemptMode] == [
        "WORKERS_ASK_CHIEF",
        "CHIEF_ONLY",
        "WORKERS_ASK_MASTER",
    ]
    with pytest.raises(AttributeError, match="it holds CheckpointContext"):
        det.core.NoSuchName  # noqa: B018
