"""Faults as a user meets them: signals to runs of one and several processes, two runs in one
checkpoint directory, unusable checkpoint directories, bad engine settings and smaller holes.

Runs that take signals are real `lightning-bridge run` processes (or training scripts)
signalled for real, every wait bounded; input errors go through the same command in this
process (`main`), which returns the exit code. The trial and its knobs are in `_folders`;
each folder's runs keep their record in its own workspace.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError
from lightning_bridge.checkpoint._layout import latest_checkpoint_in
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.experiment.cli._main import main
from tests import _folders as ff
from tests._folders import isolated_imports  # noqa: F401 - autouse fixture
from tests._trials import LinearTrial, quiet_init

SHORT = {"name": "single", "metric": "validation_loss", "max_length": {"batches": 12}}
SLOW = {"sleep": 0.05, "mark_at": 6}
LONG = {"name": "single", "metric": "validation_loss", "max_length": {"batches": 400}}


def _stop_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("Stopped by ")]


def _stopped_at(out: str) -> int:
    (line,) = _stop_lines(out)
    return int(line.split("after batch ")[1].split(";")[0])


# ----- 1. several processes: every rank stops after the same batch -----------------------------


@pytest.fixture(scope="module")
def two_process_reference(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """An uninterrupted two-process run (Lightning's launcher) of 40 batches."""
    folder = ff.fault_folder(
        tmp_path_factory.mktemp("reference"),
        resources={"slots_per_trial": 2},
        searcher={**SHORT, "max_length": {"batches": 40}},
    )
    result = ff.run_cli(folder)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.mark.slow
@pytest.mark.processes
def test_sigterm_to_the_runner_of_two_processes_stops_both_and_continues_exactly(
    tmp_path: pathlib.Path, two_process_reference: pathlib.Path
) -> None:
    """slots_per_trial: 2 starts rank 1 through Lightning's launcher; SIGTERM reaches rank 0
    only. Before, rank 0 checkpointed (a collective) while rank 1 was in the next batch."""
    folder = ff.fault_folder(
        tmp_path,
        resources={"slots_per_trial": 2},
        hyperparameters=SLOW,
        searcher={**SHORT, "max_length": {"batches": 40}},
    )
    proc = ff.start_run(folder)
    ff.wait_for(folder / "training.1", proc)
    proc.send_signal(signal.SIGTERM)
    code, out, err, took = ff.finish(proc, timeout=60)
    assert code == 0, err
    assert len(_stop_lines(out)) == 1, out  # printed by rank 0 only
    assert ff.wait_group_gone(proc), "a rank is still running after the runner ended"
    stopped = _stopped_at(out)
    assert 6 <= stopped < 40
    kept = ff.checkpoints(folder)
    assert ff.steps_completed(kept[-1]) == stopped
    assert "Traceback" not in err

    resumed = ff.run_cli(folder, "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr
    final = ff.checkpoints(folder)[-1]
    reference = ff.checkpoints(two_process_reference)[-1]
    assert ff.steps_completed(final) == ff.steps_completed(reference) == 40
    assert ff.same_weights(final, reference)
    assert ff.events(folder) == ff.events(two_process_reference)


@pytest.mark.slow
@pytest.mark.processes
def test_sigterm_to_torchruns_agent_stops_every_worker_after_one_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    """A script entrypoint on two processes runs under torchrun; its agent passes the signal
    to both workers at once. Before, the agent exited 1 with a SignalException traceback."""
    folder = ff.fault_folder(
        tmp_path,
        entrypoint="python3 -m determined.launch.torch_distributed -- python3 train.py",
        resources={"slots_per_trial": 2},
        hyperparameters=SLOW,
        searcher=LONG,
    )
    proc = ff.start_run(folder)
    ff.wait_for(folder / "training.1", proc)
    (agent,) = ff.children(proc.pid)
    os.kill(agent, signal.SIGTERM)
    code, out, err, took = ff.finish(proc, timeout=60)
    assert code == 0, err
    assert len(_stop_lines(out)) == 1, out
    assert "Traceback" not in err and "SignalException" not in err
    stopped = _stopped_at(out)
    assert ff.steps_completed(ff.checkpoints(folder)[-1]) == stopped
    workers = [int((folder / f"pid.{rank}").read_text()) for rank in (0, 1)]
    assert not any(ff.pid_alive(pid) for pid in workers)


# ----- 2. script entrypoints get the runner's signals ----------------------------------------


@pytest.fixture
def script_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    return ff.fault_folder(
        tmp_path, entrypoint="python3 train.py", hyperparameters=SLOW, searcher=LONG
    )


@pytest.mark.processes
def test_sigterm_to_the_runner_stops_the_script_instead_of_orphaning_it(
    tmp_path: pathlib.Path,
) -> None:
    """The signal reaches the script's whole process group; its data loader's worker
    processes leave the stop to the training process."""
    script_folder = ff.fault_folder(
        tmp_path,
        entrypoint="python3 train.py",
        hyperparameters={**SLOW, "workers": 1},
        searcher=LONG,
    )
    proc = ff.start_run(script_folder)
    ff.wait_for(script_folder / "training.0", proc)
    proc.send_signal(signal.SIGTERM)  # the runner only, as a scheduler or `kill` sends it
    code, out, err, _ = ff.finish(proc, timeout=60)
    assert code == 0, err
    assert not ff.pid_alive(int((script_folder / "pid.0").read_text()))
    assert ff.steps_completed(ff.checkpoints(script_folder)[-1]) == _stopped_at(out)
    assert "Last validation metrics" in out  # the runner read the script's results


@pytest.mark.processes
def test_ctrl_c_lets_the_script_finish_its_checkpoint(script_folder: pathlib.Path) -> None:
    """Ctrl-C typed on the terminal the run was started from. Before, the runner raised
    KeyboardInterrupt (a traceback) and killed the script 0.25 s later, mid-save."""
    code, shown = ff.run_in_terminal(script_folder, b"\x03", cue="training.0")
    assert code == 0, shown
    assert "KeyboardInterrupt" not in shown and "Traceback" not in shown, shown
    (line,) = [x for x in shown.splitlines() if "Stopped by SIGINT" in x]
    stopped = int(line.split("after batch ")[1].split(";")[0])
    latest = ff.checkpoints(script_folder)[-1]
    assert not list(latest.parent.glob(".*.partial"))
    state = read_checkpoint(latest)[1]
    assert state is not None and state.batches_trained == stopped


STUBBORN = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(f"ready.{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
time.sleep(300)
"""


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.processes
def test_a_script_that_ignores_the_signal_is_killed_after_preemption_timeout(
    tmp_path: pathlib.Path, processes: int
) -> None:
    entrypoint = "python3 stubborn.py"
    if processes > 1:  # torchrun's agent enforces the timeout on its workers
        entrypoint = f"python3 -m determined.launch.torch_distributed -- {entrypoint}"
    folder = ff.fault_folder(
        tmp_path,
        entrypoint=entrypoint,
        preemption_timeout=2,
        resources={"slots_per_trial": processes},
    )
    (folder / "stubborn.py").write_text(textwrap.dedent(STUBBORN))
    proc = ff.start_run(folder)
    for rank in range(processes):  # every rank ignores SIGTERM (they start in any order)
        ff.wait_for(folder / f"ready.{rank}", proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err, took = ff.finish(proc, timeout=60)
    assert code == 128 + signal.SIGKILL
    assert took < 30
    assert "still running 2 s after SIGTERM" in err
    for rank in range(processes):
        assert not ff.pid_alive(int((folder / f"ready.{rank}").read_text()))


# ----- 3. a stop on a validation / checkpoint boundary ----------------------------------------


@pytest.mark.processes
def test_a_stop_in_the_batch_that_ends_at_a_boundary_keeps_that_boundary(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM arrives during batch 8, which ends at a validation and a checkpoint boundary:
    both happen, the stop adds no second checkpoint, and the continued run equals one that
    never stopped (validations at 4, 8 and 12 and the weights)."""
    config = {"min_checkpoint_period": {"batches": 8}, "checkpoint_policy": "none"}
    folder = ff.fault_folder(
        tmp_path / "a", hyperparameters={"signal_at": 7}, searcher=SHORT, **config
    )
    proc = ff.start_run(folder)
    code, out, err, _ = ff.finish(proc, timeout=120)
    assert code == 0, err
    assert _stopped_at(out) == 8
    assert [e["batches"] for e in ff.events(folder)] == [4, 8]
    assert [ff.steps_completed(c) for c in ff.checkpoints(folder)] == [8]

    assert main(ff.run_args(folder, "--resume", "latest")) == 0
    reference = ff.fault_folder(tmp_path / "b", searcher=SHORT, **config)
    assert main(ff.run_args(reference)) == 0
    capsys.readouterr()
    assert ff.events(folder) == ff.events(reference)
    assert [e["batches"] for e in ff.events(folder)] == [4, 8, 12]
    assert ff.same_weights(ff.checkpoints(folder)[-1], ff.checkpoints(reference)[-1])


# ----- 4. two runs in one checkpoint directory ---------------------------------------------

SHARED_RUN = """
import sys
import lightning_bridge as pytorch
from model_def import FaultTrial

hparams = {"global_batch_size": 8, "hold_save_at": 2, "sleep": 0.05}
with pytorch.init(
    hparams=hparams, checkpoint_dir=sys.argv[1], trainer_kwargs={"enable_progress_bar": False}
) as ctx:
    trainer = pytorch.Trainer(FaultTrial(ctx), ctx)
    trainer.fit(max_length=pytorch.Batch(400), checkpoint_period=pytorch.Batch(2))
"""


@pytest.mark.processes
def test_a_second_run_leaves_the_first_runs_save_in_progress_alone(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two training scripts given one checkpoint directory; the first one's save is held
    half-written while the second starts. Before, the second deleted it and the first died."""
    shared = tmp_path / "shared"
    shared.mkdir()
    # What a run that died mid-save left: removed by the next run to hold the directory.
    (shared / ".0000dead.partial").mkdir()
    (shared / ".latest.0000dead").write_text("0000dead\n")
    (shared / ".run.0000dead.lock").write_text("{}")
    folder = ff.fault_folder(tmp_path)
    (folder / "shared_run.py").write_text(SHARED_RUN)
    first = subprocess.Popen(
        [sys.executable, "shared_run.py", str(shared)],
        cwd=folder,
        env=ff.cli_env(folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        ff.wait_for(folder / "saving", first)  # its first save is held, half-written
        names = {p.name for p in shared.iterdir()}
        assert not names & {".0000dead.partial", ".latest.0000dead", ".run.0000dead.lock"}
        (in_progress,) = shared.glob(".*.partial")

        with quiet_init(checkpoint_dir=shared) as ctx:
            pytorch.Trainer(LinearTrial(ctx), ctx).fit(max_length=pytorch.Batch(4))
        assert in_progress.is_dir(), "the second run removed the first run's save in progress"
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any(
            "another run is using the checkpoint directory" in w and f"pid {first.pid}" in w
            for w in warnings
        ), warnings

        (folder / "release").touch()
        deadline = time.monotonic() + 60
        while in_progress.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)
        code, out, err, _ = ff.finish(first, timeout=60)
    finally:
        ff.kill_group(first)
    assert code == 0, err
    assert "Traceback" not in err
    mine = [c for c in ff.in_directory(shared) if c.name in out]
    assert mine and all(read_checkpoint(c)[1] is not None for c in mine)


# ----- 5. unusable checkpoint directories ------------------------------------------------


@contextlib.contextmanager
def _mounted(path: pathlib.Path, options: str) -> Iterator[bool]:
    """A tmpfs at `path` with mount `options`, when this user may mount one."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield False
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    try:
        yield done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _run_with_storage(folder: pathlib.Path, host_path: pathlib.Path) -> int:
    return main(ff.run_args(folder, "--set", f"checkpoint_storage.host_path={host_path}"))


def test_unusable_checkpoint_directories_fail_before_training(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    cases = [(a_file, "exists and is not a directory"), (loop, "symbolic link loop")]
    for host_path, reason in cases:
        assert _run_with_storage(folder, host_path) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(host_path) in err and reason in err, err
    assert not ff.events(folder), "training ran"

    read_only = tmp_path / "read-only"
    with _mounted(read_only, "ro,size=1m") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("a read-only directory needs a read-only mount for root")
            read_only.chmod(0o555)
        assert _run_with_storage(folder, read_only) == 2
        err = capsys.readouterr().err
        assert str(read_only) in err and ("read-only" in err or "permission denied" in err)
    assert not ff.events(folder)


FSIZE_RUN = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (12 * 1024, 12 * 1024))
import lightning_bridge as pytorch
from model_def import FaultTrial

with pytorch.init(
    hparams={"global_batch_size": 8},
    checkpoint_dir=sys.argv[1],
    trainer_kwargs={"enable_progress_bar": False},
) as ctx:
    trainer = pytorch.Trainer(FaultTrial(ctx), ctx)
    trainer.fit(max_length=pytorch.Batch(8), checkpoint_period=pytorch.Batch(4))
"""


def test_a_full_disk_at_save_time_is_one_message_and_keeps_earlier_checkpoints(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real full file system when this user may mount a small tmpfs: the checkpoint storage
    (`host_path`) of a `lightning-bridge run` fills up as checkpoints are moved there.
    Otherwise a training script under a file-size limit (RLIMIT_FSIZE), whose first save fails
    the same way (EFBIG instead of ENOSPC)."""
    store = tmp_path / "store"
    folder = ff.fault_folder(
        tmp_path,
        searcher={**SHORT, "max_length": {"batches": 40}},
        checkpoint_policy="all",
        checkpoint_storage={"type": "shared_fs", "host_path": str(store), "save_trial_latest": 9},
    )
    with _mounted(store, "size=64k") as mounted:
        if mounted:
            assert main(ff.run_args(folder)) == 1
            err = capsys.readouterr().err
            errors = [line for line in err.splitlines() if "error" in line.lower()]
            assert len(errors) == 1 and "Traceback" not in err, err
            (message,) = errors
            assert str(store) in message and "no space left" in message and "free" in message
            earlier = ff.in_directory(store)
            assert earlier, "no checkpoint fitted before the disk was full"
            assert all(read_checkpoint(c)[1] is not None for c in earlier)
            assert not list(store.glob(".*.partial"))
        else:
            (folder / "fsize_run.py").write_text(FSIZE_RUN)
            proc = subprocess.Popen(
                [sys.executable, "fsize_run.py", str(store)],
                cwd=folder,
                env=ff.cli_env(folder),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            code, _, err, _ = ff.finish(proc, timeout=120)
            assert code == 1, err
            message = err.strip().splitlines()[-1]  # the script's exception
            assert message.startswith("lightning_bridge._errors.CheckpointWriteError: ")
            assert "file size limit" in message
            assert not list(store.glob(".*.partial"))
        assert "a checkpoint needs about" in message
        assert "checkpoints written before are intact" in message
    print("full disk simulated with", "a 64 KB tmpfs" if mounted else "RLIMIT_FSIZE")


# ----- 6. engine settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--precision", "fp17"], ["--precision: unknown precision 'fp17'", "bf16-mixed"]),
        (["--strategy", "ddpp"], ["--strategy: unknown strategy 'ddpp'", "ddp, ddp_spawn"]),
        (["--devices", "abc"], ["--devices: 'abc' is not accepted", "positive number"]),
    ],
)
def test_engine_settings_are_checked_before_the_trial_is_built(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: list
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    assert main(ff.run_args(folder, *args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(e in err for e in expected), err
    assert not (folder / "pid.0").exists(), "the trial was built"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_setting_without_a_gpu_backend(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT, resources={"slots_per_trial": 2})
    assert main(ff.run_args(folder, "--accelerator", "gpu")) == 2
    err = capsys.readouterr().err
    assert "'gpu' needs a GPU backend" in err and "accepted here: auto, cpu" in err


def test_more_processes_than_cores_needs_force(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cores = len(os.sched_getaffinity(0))
    folder = ff.fault_folder(tmp_path, searcher=SHORT, resources={"slots_per_trial": cores + 1})
    assert main(ff.run_args(folder)) == 2  # stdin is not a terminal here
    err = capsys.readouterr().err
    assert f"asks for {cores + 1} processes" in err and "--force" in err
    assert not (folder / "pid.0").exists()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"precision": "fp17"}, "precision=: unknown precision"),
        ({"strategy": "ddpp"}, "strategy=: unknown strategy"),
        ({"devices": -1, "accelerator": "cpu"}, "devices=: -1 is not accepted"),
        ({"distributed": "yes"}, "init(distributed=...) takes a DistributedContext"),
    ],
)
def test_init_checks_its_engine_arguments(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(expected)):
        with pytorch.init(**kwargs):
            pass


# ----- 7. smaller holes -------------------------------------------------------------------


@pytest.mark.parametrize("unit", [pytorch.Batch("4"), pytorch.Epoch("1")])
def test_a_string_period_is_refused_before_training(unit: Any) -> None:
    with quiet_init() as ctx:
        trainer = pytorch.Trainer(LinearTrial(ctx), ctx)
        with pytest.raises(InvalidArgumentError, match="must count .* with integers"):
            trainer.fit(max_length=pytorch.Batch(4), validation_period=unit)
    assert not pathlib.Path("checkpoints").exists()


def test_a_yaml_alias_bomb_is_refused_quickly(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"] + [
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)
    ]
    bomb = (folder / "const.yaml").read_text() + "data:\n" + "".join(f"  {x}\n" for x in levels)
    (folder / "const.yaml").write_text(bomb)
    assert len(bomb) < 2000
    start = time.monotonic()
    assert main(ff.run_args(folder)) == 2
    assert time.monotonic() - start < 10
    assert "expands to about" in capsys.readouterr().err
    (folder / "const.yaml").write_text(bomb.replace("l8: &l8 [", "l8: &l8 [*l8, "))
    assert main(ff.run_args(folder)) == 2
    assert "refers to itself" in capsys.readouterr().err


def test_resume_of_a_missing_checkpoint_is_bad_input(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = ff.fault_folder(tmp_path, searcher=SHORT)
    assert main(ff.run_args(folder, "--resume", str(tmp_path / "nope"))) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def continued_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A fit of 16 batches checkpointing after every one (keeping the latest 2), continued
    with fit(latest_checkpoint="latest") to 32; returns the checkpoint directory."""
    base = tmp_path_factory.mktemp("continued") / "checkpoints"
    storage = {"type": "shared_fs", "save_trial_latest": 2, "save_trial_best": 0}
    # In a folder of its own: the checkpoints copy the working directory into code/.
    here = os.getcwd()
    os.chdir(base.parent)
    try:
        for length, latest in ((16, None), (32, "latest")):
            with quiet_init(checkpoint_dir=base, exp_conf={"checkpoint_storage": storage}) as ctx:
                pytorch.Trainer(LinearTrial(ctx), ctx).fit(
                    max_length=pytorch.Batch(length),
                    checkpoint_period=pytorch.Batch(1),
                    latest_checkpoint=latest,
                )
    finally:
        os.chdir(here)
    return base


def test_retention_covers_the_checkpoints_of_the_run_continued(continued_run: pathlib.Path):
    """Before, the continued fit kept its own latest 2 and forgot the first fit's."""
    assert [ff.steps_completed(c) for c in ff.in_directory(continued_run)] == [31, 32]


def test_a_damaged_latest_pointer_falls_back_to_the_newest_checkpoint(
    continued_run: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = continued_run
    pointer = base / "latest"
    kept = pointer.read_bytes()
    try:
        for damaged in (b"\xff\xfe not utf-8", b"../../elsewhere\n"):
            pointer.write_bytes(damaged)
            assert latest_checkpoint_in(base) == ff.in_directory(continued_run)[-1]
            assert "does not name a checkpoint" in caplog.text
    finally:
        pointer.write_bytes(kept)


def test_load_trial_refuses_what_load_data_names_unless_it_is_a_trial_class(
    continued_run: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ff.in_directory(continued_run)[-1]
    copy = tmp_path / "ckpt"
    shutil.copytree(source, copy)  # with its code/ (the working directory, as Determined's)
    load_data = json.loads((copy / "load_data.json").read_text())
    load_data["trial_cls_spec"] = "builtins:print"  # called, it would print the context
    (copy / "load_data.json").write_text(json.dumps(load_data))
    capsys.readouterr()
    with pytest.raises(InvalidCheckpointError, match="not a PyTorchTrial subclass"):
        pytorch.load_trial_from_checkpoint_path(copy)
    assert capsys.readouterr().out == ""

    with open(copy / "load_data.json", "w") as f:  # sparse: 17 MB without writing them
        f.truncate(17 * 2**20)
    with pytest.raises(InvalidCheckpointError, match="it was not read"):
        pytorch.load_trial_from_checkpoint_path(copy)


def test_save_errors_name_the_reason() -> None:
    from lightning_bridge.checkpoint._writable import tensor_bytes, write_failure

    base = pathlib.Path("/ckpt")
    needed = tensor_bytes({"w": torch.zeros(1024)})
    exc = OSError(errno.ENOSPC, "No space left on device", "/ckpt/.x.partial/state_dict.pth")
    message = str(write_failure(base, exc, needed))
    assert message.startswith("could not write a checkpoint to /ckpt/.x.partial/state_dict.pth")
    assert "no space left" in message and "about 4.0 KB" in message
    exc = OSError(errno.EROFS, "Read-only file system", "/elsewhere/file")
    message = str(write_failure(base, exc, needed, latest=base / "abc"))
    assert message.startswith("could not write a checkpoint to /ckpt: it is on a read-only")
    assert "intact (the latest is /ckpt/abc)" in message
