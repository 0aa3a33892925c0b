"""A search's trials in long-running Slurm worker jobs (`run --launcher slurm --worker-jobs N`).

One job per trial imports Python, torch and Lightning anew for every trial (15-40 s before its
first batch). With `--worker-jobs N` the coordinator submits N jobs instead, each sized for
one trial (the trial's `sbatch` options, as `SlurmLauncher` builds them); each runs a search
worker (`SearchWorker`, as `search-worker` does) that pulls the search's trials from
its storage and forks each from its warm process (`_warm`): after the job's own start, a
trial starts in about a second. Every trial keeps what a trial job gives it: its own process,
process group, log and working copy; the record names its job (`experiment describe`:
"slurm job N RUNNING, a trial of search worker job N"),
and `experiment pause | kill` signal that job.

What Slurm does to a worker job reaches its trials as it would reach a trial job:

- `experiment pause`, `scontrol requeue`, a preemption (SIGTERM): the worker's trials finish
  their batch, checkpoint and are given back to the search; a requeued job, or any other
  worker job, continues them from their checkpoints.
- The time limit's signal (`--signal`, SIGUSR1): the same, then the job requeues itself.
- `experiment kill`, a job cancelled or failed, a node lost: the coordinator gives the job's
  trials back in the search (`SearchDriver.requeue_job`) and records them STOPPED.

The coordinator follows its jobs with `scontrol` (as `SlurmLauncher` does), prints what each
worker prints, and ends when every job has ended. A worker job that ends before the search
finished (paused, killed, failed) stops the others too: the search stops, its trials
checkpointed, for `experiment continue ID` to resume. Ctrl-C / SIGTERM of the coordinator
pauses every job; a second signal cancels them. Trials across nodes are refused: each runs as
a job of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pathlib
import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.launch.slurm._launcher import (
    POLL_S,
    JobInfo,
    JobWatch,
    SlurmLauncher,
    SlurmRefused,
    SlurmSettings,
    sbatch,
    signal_job,
    unreachable_in,
)
from lightning_bridge.experiment.searches._search_to_serve import SearchToServe
from lightning_bridge.experiment.searches._storage_outage import StorageOutage
from lightning_bridge.experiment.trial_process._signals import handling
from lightning_bridge.record._outage import RETRY_S, is_unavailable, reason
from lightning_bridge.record._registry import LIVE_JOB_STATES, Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.search import SearchDriver


def check_worker_jobs(plan: _plan.Plan, count: int | None) -> None:
    """Refuse `--worker-jobs` where it cannot apply, before anything is recorded (the plan's
    launcher says: only the Slurm launcher has worker jobs)."""
    from lightning_bridge.experiment.launch._registry import launcher_for

    launcher_for(plan.options.launcher).check_worker_jobs(plan, count)


@dataclasses.dataclass
class WorkerJob:
    """A submitted worker job as the coordinator follows it."""

    job_id: str
    output: pathlib.Path
    read: int = 0  # how much of its output was printed
    ended: bool = False
    watch: JobWatch = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.watch = JobWatch(self.job_id)

    @property
    def info(self) -> JobInfo | None:
        """The job's last state seen while Slurm knew it."""
        return self.watch.last


class WorkerJobs:
    """Serve a search from `N` Slurm worker jobs (see the module docstring); the same
    `serve()` as `SearchWorker`'s."""

    def __init__(
        self,
        registry: Registry,
        driver: SearchDriver,
        search: SearchToServe,
        *,
        say: Callable[[str], None],
    ) -> None:
        self.registry = registry
        self.driver = driver
        self.search = search
        self.count = int(search.options.worker_jobs or 1)
        self.plan = _plan.prepare_config(
            search.config.first_configuration(), search.context_dir, search.options
        )
        self.say = say
        self.jobs: list[WorkerJob] = []
        self.unreachable: str | None = None
        self._signals = 0
        self._stopped_because: str | None = None
        self._outage = StorageOutage()

    # ----- submitting -----

    def _submit(self, launcher: SlurmLauncher, number: int) -> WorkerJob:
        folder = self.registry.workspace.experiment_dir(self.search.experiment_id) / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "lightning_bridge.experiment._slurm_worker_job",  # a name kept stable for job scripts
            str(self.registry.workspace.root),
            str(self.search.experiment_id),
            f"--lost-after={self.search.lost_after_s}",
        ]
        script = folder / "worker.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"# lightning-bridge: experiment {self.search.experiment_id}, a search worker job\n"
            f"exec {shlex.join(command)}\n"
        )
        job_id, path = sbatch(
            script,
            name=f"lb-{self.search.experiment_id}-w{number}",
            chdir=folder,
            options=launcher.job_options(SlurmSettings.of(self.plan)),
            what="a search worker job",
        )
        self.say(f"Search worker: Slurm job {job_id} submitted; its output: {path}")
        return WorkerJob(job_id, path)

    # ----- following -----

    def serve(self) -> bool:
        """Submit the worker jobs and follow them to their end; whether the search finished.
        A job's node that could not reach the record or the search's storage raises
        `SearchStorageUnavailable` with its message, once every job has ended."""
        from lightning_bridge.experiment.searches._worker import SearchStorageUnavailable

        launcher = SlurmLauncher()
        launcher.check(self.plan)
        with handling(self._on_signal):
            try:
                for number in range(self.count):
                    if self._signals:
                        break
                    self.jobs.append(self._submit(launcher, number))
            except SlurmRefused:
                for job in self.jobs:  # none left serving a search that did not start
                    signal_job(job.job_id, None)
                raise
            while not all(job.ended for job in self.jobs):
                self._turn_through_outages()
                time.sleep(POLL_S)
            self._relay()
        if self.unreachable is not None:
            raise SearchStorageUnavailable(self.unreachable)
        finished = self.driver.is_finished()
        if not finished and self._stopped_because and not self._signals:
            self.say(f"The search stopped: {self._stopped_because}")
        return finished

    def _turn_through_outages(self) -> None:
        """`_turn`, while the search's storage may be away a while (a database server
        restarting): the jobs go on meanwhile; its connections are opened anew, and a job's
        end is handled once the storage is back. Away longer than `RETRY_S`: the error."""
        try:
            if self._outage.reopen():
                self.driver = SearchDriver(self.search.storage, self.driver.name)
            self._turn()
            self._outage.back()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            away = self._outage.away(close=self.driver.close)
            if away is None:
                self.say(f"The search storage is unavailable ({reason(exc)}); retrying")
            elif away > RETRY_S:
                raise

    def _turn(self) -> None:
        """One poll: each job's state (recorded for its trials as it changes), its new
        output, its end (handled whole before the job counts as ended)."""
        self._relay()
        finished = self.driver.is_finished()
        for job in self.jobs:
            if job.ended:
                continue
            info = job.watch.poll(functools.partial(self._changed, job))
            if info is not None and info.live:
                if finished and info.state == "PENDING":
                    signal_job(job.job_id, None)  # never started: no longer needed
                continue
            self._ended(job, "GONE" if info is None else info.state)
            job.ended = True

    def _changed(self, job: WorkerJob, now: JobInfo | None, before: JobInfo | None) -> None:
        """A worker job's state changed: a requeue is said."""
        if now is not None and before is not None and now.restarts > before.restarts:
            self.say(f"Slurm job {job.job_id} was requeued ({now.reason or 'requeue'})")

    def _relay(self) -> None:
        """Print what the worker jobs printed since the last poll, each line with its job."""
        for job in self.jobs:
            try:
                with job.output.open("rb") as f:
                    f.seek(job.read)
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            job.read += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                self.say(f"[slurm job {job.job_id}] {line}")

    def _ended(self, job: WorkerJob, state: str) -> None:
        """A worker job ended: its trials still running in the search are given back (its
        worker could not: cancelled, failed, its node lost), and recorded STOPPED; before the
        search finished, the other jobs stop too."""
        self._relay()
        for number in self.driver.requeue_job(job.job_id):
            self.say(f"Search trial {number}: its worker job {job.job_id} ended {state}; pending")
        with contextlib.suppress(Exception):
            problem = unreachable_in(job.output)
            if problem is not None:
                self.unreachable = problem
        for row in self.registry.jobs(self.search.experiment_id):
            if row.job_id != job.job_id or row.state not in LIVE_JOB_STATES:
                continue
            self.registry.job_state(row.trial_id, state, f"search worker job {job.job_id} ended")
            self.registry.trial_ended(
                row.trial_id,
                TrialState.STOPPED,
                f"its search worker job {job.job_id} ended {state}",
                if_active=True,
            )
        if self.driver.is_finished() or self._stopped_because is not None:
            return
        self._stopped_because = (
            f"search worker job {job.job_id} ended {state} before the search finished "
            f"(its output: {job.output})"
        )
        live = [j for j in self.jobs if not j.ended and j is not job]
        if live:
            self.say(
                f"Search worker job {job.job_id} ended {state} before the search finished: "
                "stopping the other worker jobs (their trials checkpoint and stop)"
            )
        for other in live:
            self._stop(other, force=False)

    def _stop(self, job: WorkerJob, force: bool) -> None:
        """Pause a running job (its trials checkpoint and stop) or cancel it (pending, or
        `force`)."""
        pending = job.info is None or job.info.state == "PENDING"
        signal_job(job.job_id, None if force or pending else signal.SIGTERM)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        force = self._signals > 1
        for job in self.jobs:
            if not job.ended:
                self._stop(job, force)
        with contextlib.suppress(OSError, RuntimeError):
            if force:
                self.say("Cancelling the search's worker jobs (a second signal)")
            else:
                self.say(
                    f"Stopping ({signal.Signals(signum).name}): each worker job's trials finish "
                    "their batch, checkpoint and stop"
                )
