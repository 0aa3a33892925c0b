"""Faults of the experiment layer as a careless or hostile user meets them: a workspace that
cannot hold the record, a `--storage` that is not a storage, a checkpoint's `code/` that would
swallow the run's own outputs, orphans after a kill, services that go away mid-run.

Each case runs the real command (`python -m lightning_bridge ...` in a process of its own, or
`main()` where only the refusal matters) on real files, and checks the exit code, the one
message, and that nothing already written changed (every file's hash before and after).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.experiment.cli._main import main
from tests import _folders as ff
from tests._folders import isolated_imports  # noqa: F401 - autouse fixture
from tests._servers import PostgresServer
from tests._trials import LinearTrial, Recorder, RegressionData, fit

SHORT = {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}}
SEARCH = {
    "name": "random",
    "metric": "validation_loss",
    "max_trials": 2,
    "max_length": {"batches": 4},
}


def hashes(root: pathlib.Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha1): what must not change."""
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def command(folder: pathlib.Path, *args: str, timeout: float = 240) -> tuple[int, str, str]:
    """`python -m lightning_bridge ARGS` in `folder`, as a user types it."""
    done = subprocess.run(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=folder,
        env=ff.cli_env(folder),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr


def one_error(err: str) -> str:
    """The one line a refusal prints (no traceback, nothing else)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lightning-bridge: error: "), err
    return lines[0]


# ----- a workspace that cannot hold the record --------------------------------------------


@pytest.fixture
def read_only_folder(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A folder nobody may write: a read-only tmpfs for root, else a folder without write
    permission."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.skip("a read-only folder needs a read-only mount for root")
        mounted = True
    else:
        folder.chmod(0o555)
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        else:
            folder.chmod(0o755)


@pytest.mark.processes
def test_run_with_a_read_only_workspace_names_it(
    tmp_path: pathlib.Path, read_only_folder: pathlib.Path
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    before = hashes(folder)
    for workspace in (read_only_folder, read_only_folder / "ws"):
        code, _, err = command(folder, "run", "const.yaml", "--workspace", str(workspace))
        assert code == 2
        line = one_error(err)
        assert f"the workspace {workspace} is read-only" in line and "--workspace DIR" in line
    assert hashes(folder) == before  # nothing trained (no events, no pid file)


@pytest.mark.processes
def test_run_and_list_on_a_damaged_record_say_how_to_recover(tmp_path: pathlib.Path) -> None:
    """Garbage bytes in the workspace's registry file: one message naming the file, what is
    wrong and how to go on; the file and the checkpoints beside it stay as they are."""
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    assert main(ff.run_args(folder)) == 0
    workspace = ff.workspace(folder)
    registry = workspace / "registry.sqlite"
    for name in ("registry.sqlite-wal", "registry.sqlite-shm"):
        (workspace / name).unlink(missing_ok=True)
    registry.write_bytes(os.urandom(8192))
    before, code_before = hashes(workspace), hashes(folder)
    for args in (["run", "const.yaml"], ["experiment", "list"], ["checkpoint", "list"]):
        code, _, err = command(folder, *args, "--workspace", str(workspace))
        assert code == 2, err
        line = one_error(err)
        assert f"the workspace's record {registry} is damaged (file is not a database)" in line
        assert f"mv {registry} {registry}.damaged" in line
        assert "checkpoints under" in line and "untouched" in line
    assert hashes(workspace) == before
    assert hashes(folder) == code_before

    registry.rename(registry.with_name("registry.sqlite.damaged"))  # as the message says
    assert main(ff.run_args(folder)) == 0
    kept = [p for p in (workspace / "experiments").rglob("metadata.json")]
    assert len(kept) == 2, "the first run's checkpoint is still there beside the new one"


# ----- a --storage that is not a storage ----------------------------------------------------


def _experiments(folder: pathlib.Path) -> int:
    registry = ff.workspace(folder) / "registry.sqlite"
    if not registry.exists():
        return 0
    from lightning_bridge.record._registry import Registry

    with Registry(ff.workspace(folder)) as record:
        return len(record.experiments())


@pytest.mark.processes
def test_run_with_a_storage_that_is_not_a_storage_records_nothing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SEARCH, hyperparameters={"lr": 0.05})
    (folder / "garbage.db").write_bytes(b"\x00not sqlite" * 100)
    before = hashes(folder)
    code, _, err = command(folder, "run", "const.yaml", "--storage", "model_def.py")
    assert code == 2
    line = one_error(err)
    assert f"--storage {folder / 'model_def.py'}: the file exists and is not an Optuna journal" in (
        line
    )
    cases = [
        ("nosuch://host/x", "nosuch:// is not a storage a search can live in"),
        (str(folder), "it is a folder"),
        (f"sqlite:///{folder / 'garbage.db'}", "exists and is not an SQLite database"),
        ("postgresql://nobody@127.0.0.1:1/none", "the server does not answer"),
    ]
    for storage, reason in cases:
        assert main([*ff.run_args(folder), "--storage", storage]) == 2
        assert reason in one_error(capsys.readouterr().err)
    assert _experiments(folder) == 0, "a refused --storage left an experiment behind"
    assert hashes(folder) == before
    assert not list(folder.glob("*.search-lock"))


@pytest.mark.processes
def test_search_worker_for_a_search_that_does_not_exist_creates_nothing(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SEARCH, hyperparameters={"lr": 0.05})
    journal = tmp_path / "search.journal"
    code, _, err = command(
        folder, "search-worker", "some-search", "--storage", str(journal), "--workspace",
        str(ff.workspace(folder)),
    )  # fmt: skip
    assert code == 2
    assert "no such file, so no search is stored there" in one_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]  # no journal, no lock, no ws

    # A real search's journal, asked for another name: refused, the journal unchanged.
    assert main([*ff.run_args(folder), "--storage", str(journal)]) == 0
    name = capsys.readouterr().out.split(" search ", 1)[1].split()[0]
    before = hashes(tmp_path)
    assert main(["search-worker", "typo", "--storage", str(journal)]) == 2
    line = one_error(capsys.readouterr().err)
    assert f"it holds no search named 'typo' (searches there: {name})" in line
    assert hashes(tmp_path) == before


# ----- a checkpoint's code/ ---------------------------------------------------------------


@pytest.mark.processes
def test_checkpoints_of_a_run_whose_storage_and_workspace_sit_in_its_folder_copy_only_code(
    tmp_path: pathlib.Path,
) -> None:
    """`host_path: ckpts` (relative: inside the experiment folder) and `--workspace ws` in the
    folder too; a checkpoint every batch, three kept. Before, each checkpoint's code/ took in
    the earlier checkpoints and the workspace (95 MB for a 400 KB model)."""
    folder = ff.fault_folder(
        tmp_path,
        searcher={**SHORT, "max_length": {"batches": 6}},
        min_checkpoint_period={"batches": 1},
        checkpoint_storage={"type": "shared_fs", "host_path": "ckpts", "save_trial_latest": 3},
    )
    (folder / "helpers.py").write_text("VALUE = 1\n")
    code, out, err = command(folder, "run", "const.yaml", "--workspace", "ws")
    assert code == 0, err
    kept = sorted((folder / "ckpts").iterdir(), key=lambda p: ff.steps_completed(p))
    assert [ff.steps_completed(c) for c in kept] == [4, 5, 6]
    for checkpoint in kept:
        copied = sorted(str(p.relative_to(checkpoint / "code")) for p in checkpoint.rglob("code/*"))
        assert copied == ["const.yaml", "helpers.py", "model_def.py", "train.py"], copied


def test_a_folder_over_the_code_bound_is_refused_before_training(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    (folder / "data").mkdir()
    with open(folder / "data" / "images.bin", "wb") as f:  # sparse: 96 MiB without writing it
        f.truncate(96 * 2**20)
    before = hashes(folder)
    assert main(ff.run_args(folder)) == 2
    line = one_error(capsys.readouterr().err)
    assert f"the experiment folder {folder} holds 96.0 MiB of files" in line
    assert "over the 95 MiB every checkpoint copies into code/" in line
    assert "the largest: data/ (96.0 MiB), model_def.py (" in line and ".detignore" in line
    assert hashes(folder) == before and not ff.workspace(folder).exists()

    (folder / ".detignore").write_text("data/\n")  # as the message says
    assert main(ff.run_args(folder)) == 0
    (checkpoint,) = ff.checkpoints(folder)
    assert not (checkpoint / "code" / "data").exists()


# ----- orphans after a kill -------------------------------------------------------------

KILLED_AFTER_WRITE = """
import os
import signal

from model_def import FaultTrial, pytorch


class KillAfterWrite(pytorch.PyTorchCallback):
    # The process is killed once a checkpoint is written whole in the trial's folder, before
    # it is moved into the configured storage (kill -9 at the worst moment).
    def __init__(self, trial):
        self.trial = trial

    def on_checkpoint_write_end(self, checkpoint_dir):
        if self.trial.trained == self.trial.hp.get("kill_after_write_at"):
            os.kill(os.getpid(), signal.SIGKILL)


class KilledTrial(FaultTrial):
    def build_callbacks(self):
        return {**super().build_callbacks(), "kill": KillAfterWrite(self)}
"""


@pytest.mark.processes
def test_experiment_continue_after_a_kill_between_write_and_store_keeps_that_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    store = tmp_path / "store"
    folder = ff.fault_folder(
        tmp_path,
        entrypoint="killed:KilledTrial",
        hyperparameters={"kill_after_write_at": 4},
        searcher={**SHORT, "max_length": {"batches": 8}},
        min_checkpoint_period={"batches": 2},
        checkpoint_storage={"type": "shared_fs", "host_path": str(store), "save_trial_latest": 3},
    )
    (folder / "killed.py").write_text(KILLED_AFTER_WRITE)
    code, _, err = command(folder, "run", "const.yaml")
    assert code == -9, err
    staging = ff.workspace(folder) / "experiments" / "1" / "trials" / "1" / "checkpoints"
    (orphan,) = [p for p in staging.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert ff.steps_completed(orphan) == 4
    written = hashes(orphan)
    assert [ff.steps_completed(c) for c in store.iterdir()] == [2]

    code, out, err = command(folder, "experiment", "continue", "1")
    assert code == 0, err
    log = (staging.parent / "trial.log").read_text()
    assert (
        f"Checkpoint {orphan.name} (batch 4) was written but not stored when the trial's process "
        f"ended; stored now in {store / orphan.name}"
    ) in log
    assert f"Continuing from checkpoint {store / orphan.name}" in log
    assert hashes(store / orphan.name) == written  # moved as it was written
    # Retention (the latest 3) counted it: batches 2 went, 4, 6 and 8 are kept.
    assert sorted(ff.steps_completed(c) for c in store.iterdir()) == [4, 6, 8]
    assert [ff.steps_completed(c) for c in ff.checkpoints(folder)] == [4, 6, 8]
    assert not [p for p in staging.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert [e["batches"] for e in ff.events(folder)] == [4, 8]


# ----- services that go away mid-run --------------------------------------------------------


def _validations(workspace: pathlib.Path) -> dict[int, list[int]]:
    """The validations the record holds per trial: their batch counts."""
    from lightning_bridge.record._registry import Registry

    with Registry(workspace) as record:
        return {
            t.id: [m.batches for m in record.metrics(t.id, "validation")] for t in record.trials()
        }


def _validations_while_away(folder: pathlib.Path, proc: subprocess.Popen[str]) -> bool:
    """Whether the trial validates three more times (and so trains) while a service is away;
    waits up to 120 s for it, whatever this machine's pace."""
    start, deadline = len(ff.events(folder)), time.monotonic() + 120
    while len(ff.events(folder)) < start + 3:
        if time.monotonic() > deadline or proc.poll() is not None:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.processes
def test_a_run_whose_record_is_locked_for_a_while_trains_on_and_records_everything_once(
    tmp_path: pathlib.Path,
) -> None:
    """Another process holds the registry's write lock mid-run (far longer than a writer
    waits) while the trial validates three times. Before, the trial waited 120 s and failed
    with `database is locked`."""
    gate = ff.Gate.at(tmp_path / "gate")  # the trial held after 6 batches until the lock
    folder = ff.fault_folder(
        tmp_path,
        hyperparameters=gate.hparams(6),
        searcher={**SHORT, "max_length": {"batches": 80}},
    )
    proc = ff.start_run(folder)
    ff.wait_for(gate.reached, proc, timeout=300)
    registry = ff.workspace(folder) / "registry.sqlite"
    lock = sqlite3.connect(registry, isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")
    gate.release()
    try:
        query = "SELECT batches FROM metrics WHERE kind = 'validation' ORDER BY id"
        before = {1: [row[0] for row in lock.execute(query)]}
        trained_meanwhile = _validations_while_away(folder, proc)
    finally:
        lock.execute("COMMIT")
        lock.close()
    code, out, err, _ = ff.finish(proc, timeout=240)
    assert code == 0, err
    assert trained_meanwhile, "training waited for the record"
    after = _validations(ff.workspace(folder))
    assert after == {1: [4 * i for i in range(1, 21)]}  # every validation, once
    assert after[1][: len(before[1])] == before[1]
    log = (ff.workspace(folder) / "experiments" / "1" / "trials" / "1" / "trial.log").read_text()
    assert f"The record {registry} is unavailable (database is locked); training goes on" in log
    assert f"The record {registry} is back after" in log and "reports held back" in log
    assert "Traceback" not in err


@pytest.mark.postgres
@pytest.mark.search
def test_a_search_whose_postgresql_server_restarts_mid_trial_finishes_with_every_report_once(
    tmp_path: pathlib.Path, postgres: PostgresServer
) -> None:
    """The search's PostgreSQL server is stopped while the trial validates three times, then
    started again. Before, the worker and the trial ended in tracebacks (connection refused)."""
    import optuna

    gate = ff.Gate.at(tmp_path / "gate")  # the trial held after 6 batches until the stop
    folder = ff.fault_folder(
        tmp_path,
        hyperparameters={**gate.hparams(6), "lr": {"type": "categorical", "vals": [0.05]}},
        searcher={**SEARCH, "max_trials": 1, "max_length": {"batches": 80}},
    )
    # The server is the test run's: other tests' searches may have left studies in it.
    storage = postgres.url.replace("postgresql", "postgresql+psycopg")
    earlier = set(optuna.get_all_study_names(storage))
    proc = ff.start_run(folder, "--storage", postgres.url)
    # A search trial writes its events in its own copy of the folder.
    workdir = ff.workspace(folder) / "experiments" / "1" / "trials" / "1" / "workdir"
    ff.wait_for(gate.reached, proc, timeout=300)
    postgres.stop()
    before = _validations(ff.workspace(folder))
    gate.release()
    try:
        trained_meanwhile = _validations_while_away(workdir, proc)
    finally:
        postgres.start()
    code, out, err, _ = ff.finish(proc, timeout=300)
    assert code == 0, out + err
    assert trained_meanwhile, "training waited for the search storage"
    assert "The search storage is unavailable (" in out and "The search storage is back" in out
    after = _validations(ff.workspace(folder))
    assert after == {1: [4 * i for i in range(1, 21)]}
    assert after[1][: len(before[1])] == before[1]
    trial_log = ff.workspace(folder) / "experiments" / "1" / "trials" / "1" / "trial.log"
    log = trial_log.read_text()
    assert "is unavailable (" in log and "reports held back" in log, log
    (name,) = set(optuna.get_all_study_names(storage)) - earlier
    study = optuna.load_study(study_name=name, storage=storage)
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert sorted(trial.intermediate_values) == [4 * i for i in range(1, 21)]


# ----- errors Determined raises as RuntimeError ----------------------------------------------


class _WiderTrial(LinearTrial):
    """The same trial with a model of another shape: the checkpoint's weights do not fit."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.hp = context.get_hparams()
        self.model = context.wrap_model(torch.nn.Linear(4, 3))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))
        self.recorder, self.n_train, self.n_val = Recorder(), 32, 16


class _PlainLoaderTrial(LinearTrial):
    def build_training_data_loader(self) -> Any:
        return torch.utils.data.DataLoader(RegressionData(16), batch_size=8)


def test_except_runtime_error_written_for_determined_still_catches_its_errors(
    tmp_path: pathlib.Path,
) -> None:
    """Determined raises RuntimeError for a checkpoint whose weights do not fit the model
    (torch's load_state_dict) and for a plain torch DataLoader (not reproducible); code that
    catches them with `except RuntimeError` keeps working, and the message is the bridge's."""
    conf = {"exp_conf": {"searcher": {"metric": "val_loss"}}}
    trial, trainer = fit(
        max_length=pytorch.Batch(2), init_kwargs={"checkpoint_dir": tmp_path, **conf}
    )
    (checkpoint,) = trainer.checkpoints
    before = hashes(checkpoint)
    caught: list[str] = []
    for attempt in (
        lambda: fit(
            _WiderTrial, init_kwargs={"checkpoint_dir": tmp_path / "other", **conf},
            max_length=pytorch.Batch(4), latest_checkpoint=str(checkpoint),
        ),
        lambda: pytorch.load_trial_from_checkpoint_path(checkpoint, trial_class=_WiderTrial),
        lambda: fit(_PlainLoaderTrial, max_length=pytorch.Batch(2)),
    ):  # fmt: skip
        try:
            attempt()
        except RuntimeError as exc:
            assert isinstance(exc, pytorch.BridgeError)
            caught.append(str(exc))
    assert len(caught) == 3
    assert all("does not fit the trial's model 0" in m for m in caught[:2]), caught
    assert "build_training_data_loader" in caught[2], caught
    assert hashes(checkpoint) == before
