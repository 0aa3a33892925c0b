"""Determined's Core API (`det.core.init()`) off `lightning-bridge run`: a plain
`python3 train.py` reports, asks the searcher and the preemption signal, and stores
checkpoints as Determined's off-cluster mode does (tests/interop compares the two)."""

from __future__ import annotations

import json
import pathlib
import re

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


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"a.b": 1}, "can not contain the following character(s): $ . [ ]"),
        ({"k" * 51: 1}, "key exceeds maximum length of 50"),
        ({"a": list(range(101))}, "array exceeds maximum length of 101/100"),
        ({"a": "x" * 5001}, "value exceeds maximum length of 5000"),
        ({f"k{i}": i for i in range(1001)}, "key count limit of 1000"),
        ({"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": {"j": {"k": 1}}}}}}}}}}}, "depth"),
        ({"a": object()}, "must be JSON"),
    ],
)
def test_run_metadata_beyond_determineds_limits_is_refused(
    tmp_path: pathlib.Path, mapped: None, metadata: dict[str, object], says: str
) -> None:
    """Off `lightning-bridge run`, the process keeps its run metadata; what Determined's master
    would refuse is refused with its reason, and the metadata set before stays."""
    import determined as det

    with det.core.init(checkpoint_storage=str(tmp_path)) as core_context:
        assert core_context.train.get_metadata() is None
        kept = {"a": {"b": [1, {"x.y": 2}]}, "c": "d"}  # an array's object is one value
        assert core_context.train.set_metadata(kept) == kept
        with pytest.raises(ValueError, match=re.escape(says)):
            core_context.train.set_metadata(metadata)
        assert core_context.train.get_metadata() == kept


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


# Two processes sharing objects through `core_context.distributed` with no process group, as
# Determined's DistributedContext allowed: under torchrun (its store), or started by the script
# itself with the chief's address (`chief_ip`, the store the chief serves).
_COLLECTIVES = """
import json, os, sys
import torch.distributed as dist
import determined as det
from determined import core

if sys.argv[1] == "torchrun":
    distributed = core.DistributedContext.from_torch_distributed()
else:
    rank = int(sys.argv[2])
    distributed = core.DistributedContext(
        rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1,
        chief_ip="127.0.0.1", port_offset=int(sys.argv[3]),
    )
with det.core.init(distributed=distributed) as core_context:
    d = core_context.distributed
    seen = {
        "rank": d.rank,
        "allgather": d.allgather(d.rank * 10),
        "broadcast": d.broadcast({"from": d.rank}),
        "gather": d.gather(d.rank + 1),
        "local": d.allgather_local(d.local_rank),
        "preempt": core_context.preempt.should_preempt(),
        "group": dist.is_initialized(),
    }
    if sys.argv[1] == "worker":
        # The chief is done after its last broadcast; rank 1 reads that broadcast only once
        # the chief's process has ended, or after 5 s if it has not (it is waiting for rank 1
        # to close, and the store it serves is still there).
        if d.rank == 0:
            open("chief.pid", "w").write(str(os.getpid()))
        else:
            import pathlib, time
            deadline = time.monotonic() + 5
            while not pathlib.Path("chief.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            stat = pathlib.Path(f"/proc/{pathlib.Path('chief.pid').read_text()}/stat")
            while time.monotonic() < deadline:
                try:
                    if stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                        break  # ended (a zombie until the test reaps it)
                except FileNotFoundError:
                    break
                time.sleep(0.02)
        seen["last"] = d.broadcast("the chief's last")
with open(f"seen.{seen['rank']}.json", "w") as f:
    json.dump(seen, f)
"""


def _collectives_env(work: pathlib.Path) -> dict[str, str]:
    import os

    from tests._core_api_runs import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "LIGHTNING_BRIDGE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(_import_map.shim_dir(work)), str(REPO)])
    env["XDG_DATA_HOME"] = str(work / "xdg")
    return env


def _check_collectives(work: pathlib.Path) -> None:
    seen = [json.loads((work / f"seen.{r}.json").read_text()) for r in (0, 1)]
    for rank, s in enumerate(seen):
        assert s["rank"] == rank and s["group"] is False
        assert s["allgather"] == [0, 10] and s["local"] == [0, 1]
        assert s["broadcast"] == {"from": 0} and s["preempt"] is False
    assert seen[0]["gather"] == [1, 2] and seen[1]["gather"] is None


def test_collectives_without_a_process_group_under_torchrun(tmp_path: pathlib.Path) -> None:
    import subprocess
    import sys

    (tmp_path / "share.py").write_text(_COLLECTIVES)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + ["share.py", "torchrun"],
        cwd=tmp_path,
        env=_collectives_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_collectives(tmp_path)


def test_collectives_of_workers_a_script_starts_itself_through_chief_ip(
    tmp_path: pathlib.Path,
) -> None:
    import socket
    import subprocess
    import sys

    from lightning_bridge.contract._distributed import CHIEF_PORT

    (tmp_path / "share.py").write_text(_COLLECTIVES)
    with socket.socket() as s:  # a free port for the chief's store
        s.bind(("127.0.0.1", 0))
        offset = s.getsockname()[1] - CHIEF_PORT
    workers = [
        subprocess.Popen(
            [sys.executable, "share.py", "worker", str(rank), str(offset)],
            cwd=tmp_path,
            env=_collectives_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    for worker in workers:
        out, _ = worker.communicate(timeout=300)
        assert worker.returncode == 0, out[-3000:]
    _check_collectives(tmp_path)
    # The chief's store outlived its last broadcast until every process had read it.
    seen = [json.loads((tmp_path / f"seen.{r}.json").read_text()) for r in (0, 1)]
    assert [s["last"] for s in seen] == ["the chief's last"] * 2


def test_the_rank_of_a_process_lightnings_launcher_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning's launcher names a process's LOCAL_RANK and NODE_RANK, not its RANK: before
    its process group exists and after it is gone, the process still knows its rank."""
    from lightning_bridge.contract._distributed import DistributedContext

    for name in ("RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "0")
    assert DistributedContext().rank == 1
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert DistributedContext().rank == 3
    monkeypatch.setenv("RANK", "2")  # torchrun's, where it is given
    assert DistributedContext().rank == 2


def test_from_torch_distributed_in_a_trials_only_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """Behind Determined's launcher, one slot is torchrun's one worker (RANK 0 of 1); the bridge
    runs that process alone, and the context answers the same. Outside a trial, without
    torchrun's environment, it says how to launch."""
    from lightning_bridge.contract._distributed import DistributedContext

    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "LIGHTNING_BRIDGE_EXPERIMENT",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="needs torchrun's environment"):
        DistributedContext.from_torch_distributed()
    monkeypatch.setenv("LIGHTNING_BRIDGE_EXPERIMENT", str(tmp_path / "run.json"))
    context = DistributedContext.from_torch_distributed()
    assert (context.rank, context.size, context.local_rank, context.local_size) == (0, 1, 0, 1)
    assert (context.cross_rank, context.cross_size) == (0, 1)
