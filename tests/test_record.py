"""The record and storage layers on their own: concurrent writers, crashes, local storage,
missing back ends; and what the command costs before a trial trains."""

from __future__ import annotations

import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError
from lightning_bridge.checkpoint import _storage_config
from lightning_bridge.checkpoint._storage_config import check_backend, storage_from_config
from lightning_bridge.record._registry import Registry

REPO = pathlib.Path(__file__).resolve().parents[1]

WRITER = """
import sys
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState

registry = Registry(sys.argv[1])
exp = registry.create_experiment({"name": "w"}, name="w", searcher_metric="loss")
trial = registry.create_trial(exp, hparams={"i": 1}, seed=0)
registry.trial_started(trial)
for batch in range(1, 61):
    registry.add_metrics(trial, "training", batch, 0, {"loss": 1.0 / batch})
    if batch % 10 == 0:
        uuid = f"{exp}-{batch}"
        registry.add_checkpoint(uuid, trial, batches=batch, epochs=0, location="x")
        registry.checkpoint_completed(uuid)
    if batch == 30 and sys.argv[2] == "crash":
        print("half", flush=True)
        sys.stdin.readline()  # killed here
registry.trial_ended(trial, TrialState.COMPLETED)
print("done", flush=True)
"""


def write_at_once_one_killed(workspace: pathlib.Path, script: pathlib.Path) -> None:
    """Four processes write `WRITER`'s experiments into `workspace`'s record at once; the
    fourth is SIGKILLed half way. The three others ended, each having said "done"."""
    script.write_text(textwrap.dedent(WRITER))
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    writers = [
        subprocess.Popen(
            [sys.executable, str(script), str(workspace), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for mode in ("ok", "ok", "ok", "crash")
    ]
    crashing = writers[-1]
    assert crashing.stdout is not None and crashing.stdout.readline() == "half\n"
    crashing.send_signal(signal.SIGKILL)
    for writer in writers[:-1]:
        out, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0 and out == "done\n"
    crashing.wait(timeout=30)


def test_concurrent_writers_and_a_killed_one(tmp_path: pathlib.Path) -> None:
    """Four processes write at once, one is killed half way: every committed row is there,
    ids are unique, the database is intact."""
    workspace = tmp_path / "ws"
    write_at_once_one_killed(workspace, tmp_path / "writer.py")

    with sqlite3.connect(workspace / "registry.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with Registry(workspace) as registry:
        experiments = registry.experiments()
        assert sorted(e.id for e in experiments) == [1, 2, 3, 4]
        counts = sorted(len(registry.metrics(t.id)) for t in registry.trials())
        assert counts == [30, 60, 60, 60]
        assert len(registry.checkpoints()) == 3 * 6 + 3
        # The killed writer's trial is ACTIVE with a dead process: reconciled to ERROR.
        (gone,) = registry.reconcile()
        assert registry.trial(gone).state == "ERROR"
        assert "ended without recording an end" in registry.trial(gone).message


def test_wal_switch_waits_for_a_lock_sqlite_refuses_at_once(tmp_path: pathlib.Path) -> None:
    """SQLite can refuse the switch to WAL at once, without its busy timeout (here: a timeout
    of 0 while another connection holds the file exclusively); the record retries until the
    lock is gone instead of failing."""
    from lightning_bridge.record._sqlite import _use_wal

    path = tmp_path / "registry.db"
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("CREATE TABLE t (x)")
        other.execute("BEGIN EXCLUSIVE")
        other.execute("INSERT INTO t VALUES (1)")
        locked.set()
        release.wait(10)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(10)
    impatient = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        impatient.execute("PRAGMA journal_mode=WAL")  # what SQLite answers while locked
    threading.Timer(0.3, release.set).start()
    _use_wal(impatient)
    thread.join(10)
    assert impatient.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert impatient.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_local_storage_publish_fetch_delete(tmp_path: pathlib.Path) -> None:
    storage = storage_from_config(
        {"type": "directory", "container_path": str(tmp_path / "store")}, tmp_path / "unused"
    )
    staged = tmp_path / "trial" / "abc"
    staged.mkdir(parents=True)
    (staged / "state_dict.pth").write_bytes(b"weights")
    assert not storage.is_complete("abc")
    (staged / "metadata.json").write_text("{}")
    assert storage.publish(staged, "abc") == str(tmp_path / "store" / "abc")
    assert not staged.exists() and storage.list_complete() == ["abc"]
    copy = storage.fetch("abc", tmp_path / "out")
    assert (copy / "state_dict.pth").read_bytes() == b"weights"
    with pytest.raises(InvalidArgumentError, match="is not empty"):
        storage.fetch("abc", tmp_path / "out")
    # Without its completion mark a checkpoint is not complete, listed or fetched.
    (tmp_path / "store" / "abc" / "metadata.json").unlink()
    assert storage.list_complete() == []
    with pytest.raises(InvalidCheckpointError, match="is not complete"):
        storage.fetch("abc", tmp_path / "out2")
    storage.delete("abc")
    assert not (tmp_path / "store" / "abc").exists()


def test_a_missing_back_end_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _storage_config.importlib.util.find_spec
    hidden = {"s3fs", "gcsfs", "adlfs"}

    def find_spec(name: str, *args: object) -> object:
        return None if name in hidden else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_storage_config.importlib.util, "find_spec", find_spec)
    for kind, extra in (("s3", "s3"), ("gcs", "gcs"), ("azure", "azure")):
        with pytest.raises(InvalidArgumentError, match=rf"lightning-bridge\[{extra}\]"):
            check_backend(kind)


def test_commands_answer_without_importing_torch(tmp_path: pathlib.Path) -> None:
    """--version, --help, a config error and the record's commands load no torch and no
    Lightning: they answer at once (training imports them)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("searcher:\n  max_length:\n    epochs: -3\n")
    code = f"""
import contextlib, io, sys
from lightning_bridge.experiment.cli._main import main
for argv in (["--version"], ["--help"], ["run", "--help"], ["experiment", "list", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
assert main(["run", {str(bad)!r}]) == 2
assert main(["experiment", "list", "--workspace", {str(tmp_path / "ws")!r}]) == 0
heavy = sorted(m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules)
assert not heavy, heavy
import lightning_bridge as pytorch
assert "torch" not in sys.modules
assert pytorch.Trainer.__name__ == "Trainer" and pytorch.samplers.RepeatSampler
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "searcher.max_length.epochs: expected a positive integer" in result.stderr
    version = subprocess.run(
        [sys.executable, "-m", "lightning_bridge", "--version"],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    from lightning_bridge import __version__

    assert version.stdout.strip() == f"lightning-bridge {__version__}"


def test_running_a_script_imports_no_torch_in_the_command(tmp_path: pathlib.Path) -> None:
    """`lightning-bridge run` of a script entrypoint, one process and no engine setting given:
    the command checks, records and follows the trial without importing torch or Lightning
    (seconds of CPU a run would pay for nothing); the script's process imports what it uses."""
    folder = tmp_path / "exp"
    folder.mkdir()
    seen = tmp_path / "seen.txt"
    (folder / "train.py").write_text(
        f"import pathlib, sys\npathlib.Path({str(seen)!r}).write_text(str(sys.argv))\n"
    )
    (folder / "const.yaml").write_text(
        "name: script\nentrypoint: python3 train.py\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n"
    )
    code = f"""
import sys
from lightning_bridge.experiment.cli._main import main
assert main(["run", "const.yaml", "--workspace", {str(tmp_path / "ws")!r}]) == 0
heavy = sorted(m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules)
assert not heavy, heavy
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"], "XDG_DATA_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert seen.read_text() == "['train.py']"  # the script ran


def test_a_tensorboard_folder_does_not_pass_for_the_package(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old logs in a folder named `tensorboard` on sys.path import as an empty namespace
    package; with the real package absent the run logs CSV instead of crashing."""
    import importlib.machinery

    from lightning_bridge.translation.services import _logger_reports as _init

    (tmp_path / "tensorboard" / "events").mkdir(parents=True)

    class OnlyTheFolder:
        """Finds `tensorboard` in tmp_path alone: the package is not installed."""

        @staticmethod
        def find_spec(name: str, path: object = None, target: object = None) -> object:
            if name != "tensorboard":
                return None
            return importlib.machinery.PathFinder.find_spec(name, [str(tmp_path)])

    monkeypatch.setattr(sys, "meta_path", [OnlyTheFolder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "tensorboard", raising=False)
    assert importlib.util.find_spec("tensorboard") is not None  # the folder imports...
    assert not _init.tensorboard_installed()  # ...but is not taken for the package
    monkeypatch.undo()
    assert _init.tensorboard_installed()
