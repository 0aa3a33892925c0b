"""What a trial's Slurm job runs: `python -m lightning_bridge.experiment._slurm_job RUN_FILE`.

It trains the trial of the run description as `lightning-bridge _trial RUN_FILE` does, with
three things of its own:

- A requeued job (`SLURM_RESTART_COUNT` > 0: `scontrol requeue`, a preemption, a node lost)
  continues from the trial's latest durable checkpoint, as `experiment continue` would: the
  record says which, the run description is rewritten to name it.
- A one-task job hides its Slurm task count from Lightning (`SLURM_NTASKS`), which would
  otherwise take the job for `srun`-started ranks: the processes of a one-node trial are
  Lightning's to start, as on any machine. A job of several tasks (a trial across nodes, one
  task per process) keeps it, and Lightning's Slurm environment gives ranks and world size.
- SIGUSR1 (sbatch `--signal`, before the time limit) stops the trial as SIGTERM does (finish
  the batch, checkpoint) and then requeues the job, which continues from that checkpoint.
  Either signal during start-up (`experiment pause` of a trial still importing) waits until
  the fit catches SIGTERM: the trial stops after its first batch instead of dying unrecorded.
  A trial that failed requeues the job while its restarts are under `max_restarts`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from lightning_bridge.experiment._checkpoints import fetch, settle_checkpoints
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.translation._run_description import RunDescription


def _chief() -> bool:
    return int(os.environ.get("SLURM_PROCID", "0") or 0) == 0


def _continue_from_latest(run_file: pathlib.Path) -> None:
    """Name the trial's latest durable checkpoint in its run description (a requeued job)."""
    run = RunDescription.read(run_file)
    assert run.record is not None and run.run_dir is not None
    with Registry(run.record.workspace) as registry:
        trial_id = run.record.trial_id
        settle_checkpoints(registry, trial_id)
        latest = registry.latest_checkpoint(trial_id)
        if latest is None:
            return  # nothing durable yet: the trial starts over, as the first run did
        registry.archive_metrics_after(trial_id, latest.batches)
        local = fetch(registry, latest, run.run_dir / "restore")
    dataclasses.replace(run, latest_checkpoint=str(local), warm_start=None).write(run_file)


def _requeue(reason: str) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        print(f"lightning-bridge: requeueing Slurm job {job} ({reason})", flush=True)
        subprocess.run(["scontrol", "requeue", job], check=False)


def _stop_when_training(trained: threading.Event, ours: Any) -> None:
    """SIGTERM to this process once the fit catches it (finish the batch, checkpoint, stop):
    at once while it trains; a signal that came during start-up (the job's own handler,
    `ours`, took it) waits for the fit's handler instead of ending the process at once."""
    while not trained.is_set():
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler) and handler is not ours:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    run_file = pathlib.Path(argv[0]).resolve()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if os.environ.get("SLURM_NTASKS", "1") == "1":
        for name in ("SLURM_NTASKS", "SLURM_NPROCS"):
            os.environ.pop(name, None)
    else:  # one task per process: the record's writer is rank 0 (`run_from_file`)
        os.environ["RANK"] = os.environ.get("SLURM_PROCID", "0")
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    if restarts and _chief():
        _continue_from_latest(run_file)
    received: list[int] = []  # the first stop signal: SIGUSR1 (time limit) or SIGTERM
    trained = threading.Event()  # the trial's command returned: nothing left to stop

    def on_signal(signum: int, frame: Any) -> None:
        if not received:
            received.append(signum)
            stop = threading.Thread(target=_stop_when_training, args=(trained, on_signal))
            stop.daemon = True
            stop.start()

    for sig in (signal.SIGUSR1, signal.SIGTERM):  # the fit's own SIGTERM handler comes later
        signal.signal(sig, on_signal)
    from lightning_bridge.experiment._cli import main as cli

    try:
        code = cli(["_trial", str(run_file)])
    except SystemExit as exc:  # the fit's own exit once a signal stopped it
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        trained.set()
    if not _chief():
        return code
    run = RunDescription.read(run_file)
    assert run.record is not None
    with Registry(run.record.workspace) as registry:
        state = registry.trial(run.record.trial_id).state
    max_restarts = int(run.raw_config.get("max_restarts", 5) or 0)
    if received == [signal.SIGUSR1] and state == TrialState.STOPPED.value:
        _requeue("its time limit is near: the trial checkpointed")
    elif code != 0 and restarts < max_restarts:
        _requeue(f"the trial failed; restart {restarts + 1} of max_restarts {max_restarts}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
