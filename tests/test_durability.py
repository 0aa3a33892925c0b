"""Crash-proof checkpoint writes and preemption by SIGTERM / SIGINT."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.checkpoint._layout import latest_checkpoint_in
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from lightning_bridge.translation.fit._payload import save_checkpoint
from tests._folders import Gate, wait_for
from tests._trials import LinearTrial, quiet_init

REPO = pathlib.Path(__file__).resolve().parents[1]


class BigTrial(LinearTrial):
    """A few MB of weights so that one save takes long enough to be interrupted inside."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.big = context.wrap_model(torch.nn.Linear(1024, 1024))


# What building a trial's context and its TrialModule imports, besides this module's imports.
# A name that is no longer a module is skipped by the preload: the processes start slower.
FIT_MODULES = [
    "torch",
    "lightning.pytorch",
    "lightning_bridge.translation.fit._init",
    "lightning_bridge.translation.fit._trial_module",
]


def _save_forever(directory: str, started: Any) -> None:
    with quiet_init() as ctx:
        module = pytorch.TrialModule(BigTrial(ctx), ctx)
        started.set()
        while True:
            module.state.batches_trained += 1
            save_checkpoint(module, pathlib.Path(directory))


def _assert_store_is_consistent(directory: pathlib.Path) -> int:
    complete = [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for ckpt in complete:
        payload, state = read_checkpoint(ckpt)
        assert state is not None and len(payload["models_state_dict"]) == 2
    latest = latest_checkpoint_in(directory)
    if complete:
        # A kill between the directory rename and the pointer update leaves `latest` on the
        # previous checkpoint: older, but complete, which is the promise.
        assert latest is not None and latest in complete, "latest names a complete checkpoint"
    return len(complete)


@pytest.mark.processes
def test_killed_saves_never_leave_a_partial_checkpoint(tmp_path: pathlib.Path) -> None:
    mp = multiprocessing.get_context("forkserver")
    # The saving process imports this module (its target), what it imports and what the
    # trial's context and TrialModule import when built (Lightning, the fit): preloaded, so
    # that each of the 16 processes forks in milliseconds instead of importing them again.
    mp.set_forkserver_preload([*FIT_MODULES, "tests._trials", __name__])
    store = tmp_path / "store"
    seen = 0
    # Kill times spread over several save durations, so kills land in every phase of a save:
    # serialising, fsync, rename, and the latest pointer.
    for i in range(16):
        started = mp.Event()
        proc = mp.Process(target=_save_forever, args=(str(store), started))
        proc.start()
        assert started.wait(300), "the saving process did not start"
        time.sleep(0.013 * i)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        seen = _assert_store_is_consistent(store) if store.exists() else 0
    assert seen >= 3, "the kills were so early that nothing was ever saved"


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import lightning_bridge as pytorch
    from tests.test_resume import NoisyTrial
    from tests._folders import GATE_CODE
    from tests._trials import quiet_init

    exec(GATE_CODE)  # hold_at_gate
    gate, out, ckpt = sys.argv[1], sys.argv[2], sys.argv[3] or None

    class Held(NoisyTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):
            hold_at_gate({"gate": gate, "hold_at": 3}, batch_idx)  # until the signal
            return super().train_batch(batch, epoch_idx, batch_idx)

    with quiet_init(hparams={"global_batch_size": 8}) as ctx:
        trial = Held(ctx)
        pytorch.Trainer(trial, ctx).fit(max_length=pytorch.Batch(40), latest_checkpoint=ckpt)
    torch.save([p.detach() for p in trial.model.parameters()], out)
    """
)


def _child(tmp_path: pathlib.Path, gate: Gate, ckpt: str = "") -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), str(gate.path), str(tmp_path / "w.pt"), ckpt],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.processes
def test_signal_checkpoints_exits_zero_and_continues_exactly(
    tmp_path: pathlib.Path, sig: signal.Signals
) -> None:
    gate = Gate.at(tmp_path / "gate")
    proc = _child(tmp_path, gate)
    wait_for(gate.reached, proc, 400, "the trial held after 3 batches")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    lines = [line for line in out.splitlines() if "Continue with fit(latest_checkpoint=" in line]
    assert len(lines) == 1 and f"Stopped by {sig.name}" in lines[0]
    assert not (tmp_path / "w.pt").exists(), "the run stopped before finishing"

    gate.release()
    resumed = _child(tmp_path, gate, "latest")
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out

    from tests.test_resume import NoisyTrial

    with quiet_init(hparams={"global_batch_size": 8}) as ctx:
        straight = NoisyTrial(ctx)
        pytorch.Trainer(straight, ctx).fit(max_length=pytorch.Batch(40))
    for a, b in zip(torch.load(tmp_path / "w.pt"), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)
