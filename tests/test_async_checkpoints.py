"""Checkpoints written in the background: training goes on while a checkpoint is written, the
checkpoint holds the state of its batch, `latest` names it only once it is durable, one save
is in flight at a time, a fit (or a preemption) ends only after the write, and a failed write
is raised on the training thread."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import threading
import time
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.checkpoint._async import CheckpointWriter, Snapshotter
from lightning_bridge.checkpoint._layout import latest_checkpoint_in
from lightning_bridge.checkpoint._safe_load import read_checkpoint
from tests._trials import LinearTrial, quiet_init
from tests.test_resume import NoisyTrial


class Held:
    """A value in a checkpoint whose serialization takes its time: it waits until `release`d
    (or `delay` seconds, or until `until` is set) and records on which thread, and when, it
    was written."""

    def __init__(
        self, delay: float | None = None, fail: bool = False, until: threading.Event | None = None
    ) -> None:
        self.delay, self.fail, self.until = delay, fail, until
        self.started = threading.Event()
        self.released = threading.Event()
        self.writes: list[tuple[str, float, float]] = []  # (thread, start, end)

    def release(self) -> None:
        self.released.set()

    def __deepcopy__(self, memo: dict[int, Any]) -> Held:
        return self  # the snapshot taken before a background write keeps this object

    def __reduce__(self) -> Any:
        start = time.monotonic()
        self.started.set()
        if self.until is not None:
            self.until.wait(60)  # a bound: a fit that waits for the write is seen, not hung
        elif self.delay is not None:
            time.sleep(self.delay)
        else:
            assert self.released.wait(60), "the test never released the write"
        self.writes.append((threading.current_thread().name, start, time.monotonic()))
        if self.fail:
            raise OSError(28, "No space left on device (simulated)")
        return (collections.OrderedDict, ())


def _state(batches: int) -> dict[str, int]:
    return {"batches_trained": batches}


def _submit(writer: CheckpointWriter, base: pathlib.Path, batches: int, **extra: Any) -> Any:
    payload = {"w": torch.full((3,), float(batches)), **extra}
    path, storage_id = writer.submit(base, payload, _state(batches), {})
    writer.start(copy=True)
    return path, storage_id


def test_latest_names_a_checkpoint_only_once_it_is_durable(tmp_path: pathlib.Path) -> None:
    writer = CheckpointWriter()
    first, _ = _submit(writer, tmp_path, 1)
    writer.wait()
    assert latest_checkpoint_in(tmp_path) == first
    held = Held()
    second, storage_id = _submit(writer, tmp_path, 2, held=held)
    assert held.started.wait(30)
    # Being written: only the partial directory exists, `latest` still names the first.
    assert (tmp_path / f".{storage_id}.partial").is_dir() and not second.exists()
    assert latest_checkpoint_in(tmp_path) == first
    writer.poll()  # not done yet: returns at once
    assert writer.busy
    held.release()
    writer.wait()
    assert latest_checkpoint_in(tmp_path) == second and not writer.busy
    payload, state = read_checkpoint(second)
    assert torch.equal(payload["w"], torch.full((3,), 2.0)) and state is not None
    assert held.writes[0][0].startswith("checkpoint-"), "written on the writer's thread"


def test_the_next_save_waits_for_the_one_in_flight(tmp_path: pathlib.Path) -> None:
    writer = CheckpointWriter()
    held = Held()
    first, _ = _submit(writer, tmp_path, 1, held=held)
    assert held.started.wait(30)
    threading.Timer(0.3, held.release).start()
    start = time.monotonic()
    second, _ = writer.submit(tmp_path, {"w": torch.zeros(1)}, _state(2), {})
    assert time.monotonic() - start >= 0.25, "submit returned while a write was in flight"
    assert latest_checkpoint_in(tmp_path) == first, "the first was complete before the second"
    writer.start(copy=False)
    writer.wait()
    assert latest_checkpoint_in(tmp_path) == second


def test_a_failed_write_is_raised_and_leaves_latest_alone(tmp_path: pathlib.Path) -> None:
    writer = CheckpointWriter()
    first, _ = _submit(writer, tmp_path, 1)
    writer.wait()
    _, storage_id = _submit(writer, tmp_path, 2, held=Held(delay=0.0, fail=True))
    deadline = time.monotonic() + 30
    with pytest.raises(pytorch.CheckpointWriteError) as info:
        while time.monotonic() < deadline:
            writer.poll()  # raises once the thread has failed
            time.sleep(0.01)
    # The same one message as a save on the training thread: path, reason, what is intact.
    message = str(info.value)
    assert str(tmp_path) in message and "no space left" in message
    assert f"the latest is {first}" in message
    assert not getattr(info.value, "__notes__", None)
    assert not writer.busy
    assert latest_checkpoint_in(tmp_path) == first
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [first.name]
    assert not (tmp_path / storage_id).exists()


class Weights(pytorch.PyTorchCallback):
    """State whose checkpointing is slow; records the model's weights after every batch."""

    def __init__(self, held: Held) -> None:
        self.held = held
        self.after_batch: list[torch.Tensor] = []
        self.batch_started: list[float] = []

    def state_dict(self) -> dict[str, Any]:
        return {"held": self.held}


class Background(LinearTrial):
    """A trial without checkpoint-observing callbacks: its saves are written in the background."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        # Without `write_s`, a save is written until the third batch has begun: a fit that
        # waited for the write before training on would hold it 60 s, and then begin batch 3.
        self.third_batch = threading.Event()
        write_s = self.hp.get("write_s")
        held = Held(delay=float(write_s)) if write_s else Held(until=self.third_batch)
        self.weights = Weights(held)
        self.signal_at = self.hp.get("signal_at")

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"weights": self.weights}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.weights.batch_started.append(time.monotonic())
        if batch_idx == 2:
            self.third_batch.set()
        out = super().train_batch(batch, epoch_idx, batch_idx)
        self.weights.after_batch.append(self.model.weight.detach().clone())
        if self.signal_at == batch_idx:
            os.kill(os.getpid(), signal.SIGTERM)  # preempted, as a scheduler would
        return out


def _fit_background(**hparams: Any) -> tuple[Background, pytorch.Trainer, Any]:
    with quiet_init(hparams={"global_batch_size": 8, **hparams}) as ctx:
        trial = Background(ctx)
        trainer = pytorch.Trainer(trial, ctx)
        exit_info = None
        try:
            trainer.fit(max_length=pytorch.Batch(6), checkpoint_period=pytorch.Batch(2))
        except SystemExit as exc:
            exit_info = exc
    return trial, trainer, exit_info


def test_training_goes_on_while_a_checkpoint_is_written_and_the_fit_waits_for_the_last() -> None:
    trial, trainer, _ = _fit_background()
    writes = trial.weights.held.writes
    assert len(writes) == 3 and all(name.startswith("checkpoint-") for name, _, _ in writes)
    # The checkpoint after batch 2 was still being written when batch 3 began.
    assert trial.weights.batch_started[2] < writes[0][2]
    # Each checkpoint holds the weights of its own batch, not of later ones.
    assert len(trainer.checkpoints) == 3
    for path, batch in zip(trainer.checkpoints, (2, 4, 6), strict=True):
        payload, state = read_checkpoint(path)
        assert state is not None and state.batches_trained == batch
        saved = payload["models_state_dict"][0]["weight"]
        assert torch.equal(saved, trial.weights.after_batch[batch - 1])
    # fit() returned after the final checkpoint was durable.
    assert latest_checkpoint_in(trainer.checkpoints[-1].parent) == trainer.checkpoints[-1]


def test_a_preempted_fit_exits_after_its_checkpoint_is_written() -> None:
    trial, trainer, exit_info = _fit_background(signal_at=2, write_s=0.5)
    assert exit_info is not None and exit_info.code == 0
    assert len(trial.weights.after_batch) == 3, "stopped after the batch the signal came in"
    last = trainer.checkpoints[-1]
    payload, state = read_checkpoint(last)
    assert state is not None and state.batches_trained == 3
    assert latest_checkpoint_in(last.parent) == last


def test_a_callback_reading_the_written_checkpoint_sees_it_complete() -> None:
    seen: list[bool] = []

    class Reader(pytorch.PyTorchCallback):
        def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
            path = pathlib.Path(checkpoint_dir)
            seen.append(
                (path / "metadata.json").is_file() and latest_checkpoint_in(path.parent) == path
            )

    class Observed(Background):
        def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
            return {"weights": self.weights, "reader": Reader()}

    with quiet_init(hparams={"global_batch_size": 8, "write_s": 0.05}) as ctx:
        trial = Observed(ctx)
        pytorch.Trainer(trial, ctx).fit(
            max_length=pytorch.Batch(4), checkpoint_period=pytorch.Batch(2)
        )
    assert seen == [True, True]


def test_continuing_from_a_checkpoint_written_while_training_went_on_is_exact() -> None:
    def run(checkpoint: str | None) -> tuple[NoisyTrial, pytorch.Trainer]:
        with quiet_init(hparams={"global_batch_size": 8}) as ctx:
            trial = NoisyTrial(ctx)
            trainer = pytorch.Trainer(trial, ctx)
            trainer.fit(
                max_length=pytorch.Batch(12),
                checkpoint_period=pytorch.Batch(5),
                latest_checkpoint=checkpoint,
            )
        return trial, trainer

    straight, trainer = run(None)
    assert len(trainer.checkpoints) == 3  # batches 5, 10 and the final 12
    resumed, _ = run(str(trainer.checkpoints[0]))
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_snapshot_is_independent_of_later_training_and_keeps_shared_storage() -> None:
    snapshots = Snapshotter()
    weight = torch.arange(6.0)
    live = {"model": collections.OrderedDict(a=weight[:3], b=weight[3:]), "step": 1}
    live["model"]._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    first = snapshots.copy(live)
    weight.add_(100)  # training goes on
    assert first["model"]["b"].tolist() == [3.0, 4.0, 5.0]
    assert first["model"]._metadata == {"": {"version": 1}}
    a, b = first["model"]["a"], first["model"]["b"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # one storage
    assert a.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()
    second = snapshots.copy(live)  # the next save's copy (the first one is written by now)
    assert second["model"]["a"].tolist() == [100.0, 101.0, 102.0]
