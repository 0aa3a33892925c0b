"""`SearchWorker`: a worker of a hyperparameter search, starting its trials through a launcher.

The worker pulls trials from the search (`SearchDriver.next_trial`) while its launcher has
room for one more (`Launcher.capacity`: on this machine its GPUs, else its CPU cores, divided by
the processes a trial takes; on a cluster the scheduler places them), records each in the
workspace (a trial of the search's experiment, with its folder, log and checkpoints) and starts
it through the launcher (`Launcher.start`: a process forked from the warm one or
`python -m lightning_bridge _trial RUN_FILE` on this machine, a Slurm job, a Ray actor). The
trial's own process validates at its rungs and reports to the search, which answers at once
(`translation/services/_search_report.py`), so the worker only starts trials and waits for
them to end; a thread per trial turns its end into an event, and the worker sleeps until one
comes or a poll (other workers' trials may create new ones) or a heartbeat is due.

A trial whose process ends without closing itself in the search crashed: it is recorded
ERROR, the search is told, and the search goes on. SIGINT / SIGTERM stop the worker: each
trial is asked to stop (finish its batch, checkpoint, exit) and given back to the search, so
`experiment continue` (or another worker) resumes it from its checkpoint; a second signal
kills the trials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import queue
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from lightning_bridge._errors import BridgeError
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config import ResolvedConfig
from lightning_bridge.experiment.launch import _warm
from lightning_bridge.experiment.launch._handle import TrialProcess
from lightning_bridge.experiment.launch._registry import launcher_for
from lightning_bridge.experiment.searches._search_to_serve import SearchToServe
from lightning_bridge.experiment.searches._storage_outage import StorageOutage
from lightning_bridge.experiment.trial_process._signals import handling
from lightning_bridge.experiment.trials._checkpoints import fetch, settle_checkpoints
from lightning_bridge.experiment.trials._experiments import continue_command
from lightning_bridge.record._outage import RETRY_S, is_unavailable, reason
from lightning_bridge.record._postgres import shown
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._settings import WorkspaceSettings
from lightning_bridge.search import SearchDriver, TrialSpec
from lightning_bridge.translation.services._run_description import SearchConnection
from lightning_bridge.translation.services._trial_environment import TrialEnvironment

# How often a worker with room looks for pending trials (seconds): a trial closes itself in
# the search when its fit ends, before its process exits, and the next may start then.
POLL_S = 0.25


class SearchStorageUnavailable(BridgeError):
    """The search's storage did not come back within the bound, or a trial's node could not
    reach the search storage or the experiment record (its message names which)."""


@dataclasses.dataclass
class Launched:
    """A trial this worker started: the search's and the record's view, its process."""

    spec: TrialSpec
    run: _plan.TrialRun
    process: TrialProcess
    gpus: list[str]
    own_job: bool = False  # a scheduler's job of its own: its output is the job's


def _say(message: str) -> None:
    print(message, flush=True)


class SearchWorker:
    """Serve one search from this machine until it is finished or stopped (`serve`)."""

    def __init__(
        self,
        registry: Registry,
        driver: SearchDriver,
        search: SearchToServe,
        *,
        say: Callable[[str], None] = _say,
        slurm_job: tuple[str, str] | None = None,
        environment: TrialEnvironment | None = None,
    ) -> None:
        self.registry = registry
        self.driver = driver
        self.search = search
        self.heartbeat_s = max(min(30.0, search.lost_after_s / 4), 0.5)
        self.say = say
        self.workspace = registry.workspace
        # The Slurm worker job this worker runs in (`_slurm_workers`), its id and output
        # file: the job of each trial it runs.
        self.slurm_job = slurm_job
        # What the job this worker runs in answers (its restarts, whether it is being ended):
        # the trial environment of that job, asked rather than Slurm directly.
        self.environment = environment or TrialEnvironment()
        # Where this workspace noted its record of a trial (a trial given back may come back):
        # a shared record (PostgreSQL) is the same wherever a worker runs, a file is this
        # machine's.
        self._host_key = f"record@{socket.gethostname()}:{self.workspace.root}"
        shared = WorkspaceSettings.read(self.workspace.root).record
        self.note_key = f"record@{shown(shared)}" if shared else self._host_key
        first = _plan.prepare_config(
            search.config.first_configuration(), search.context_dir, search.options
        )
        self.processes = first.processes
        self.launcher = launcher_for(search.options.launcher)
        # On a cluster the scheduler places the trials (the searcher bounds how many run).
        self.capacity, self._gpus = self.launcher.capacity(first, self.processes)
        self.running: dict[int, Launched] = {}
        self.ran: list[int] = []
        self._events: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._unhandled: list[tuple[int, int]] = []
        self._signals = 0
        self.unreachable: str | None = None  # a trial's node could not reach a service
        self._paused = False  # a trial was stopped from outside (`experiment pause`)
        self._next_beat = 0.0
        self._outage = StorageOutage()
        # Forks the trials' processes (see _warm); with their MLflow mirror's client imported
        # when the record is mirrored (else each trial imports it, seconds, at its end).
        mirrored = _mirrored(self.workspace.root, search.options.tracking_uri)
        self._preload = _warm.preload_for(first.entrypoint.trial is None, mirrored)

    # ----- the loop -----

    def serve(self) -> bool:
        """Run trials until the search is finished (True) or this worker is stopped
        (False)."""
        for number in self.driver.requeue_orphans():
            self.say(f"Search trial {number}: its worker on this machine is gone; pending again")
        with handling(self.on_signal), contextlib.ExitStack() as stack:
            self._next_beat = time.monotonic() + self.heartbeat_s
            self.launcher.warm_up(self._preload)
            stack.callback(self.launcher.close)
            while True:
                try:
                    if self._step():
                        break
                except Exception as exc:
                    if not is_unavailable(exc):
                        raise
                    self._storage_away(exc)
                    continue
                self._storage_back()
        if self.unreachable is not None:
            raise SearchStorageUnavailable(self.unreachable)
        return not self._stopping

    @property
    def _stopping(self) -> bool:
        """This worker was signalled, or the experiment paused: it starts no trial and ends
        once its running trials have."""
        return bool(self._signals) or self._paused

    def _step(self) -> bool:
        """One turn of the loop: start trials while there is room, handle the trials that
        ended, keep this worker's trials alive. True when the worker is done."""
        if self._outage.reopen():
            self.driver = SearchDriver(self.search.storage, self.driver.name, job=self.driver.job)
        if not self._stopping:
            self._fill()
        if not self.running and (self._stopping or self.driver.is_finished()):
            return True
        room = len(self.running) < self.capacity and not self._stopping
        wait = POLL_S if room else max(self._next_beat - time.monotonic(), 0.0)
        self._handle_ended()  # ends whose handling the storage interrupted come first
        try:
            self._unhandled.append(self._events.get(timeout=wait))
            while True:
                self._unhandled.append(self._events.get_nowait())
        except queue.Empty:
            pass
        self._handle_ended()
        if time.monotonic() >= self._next_beat:
            self._beat()
            self._next_beat = time.monotonic() + self.heartbeat_s
        return False

    def _handle_ended(self) -> None:
        while self._unhandled:
            self._ended(*self._unhandled[0])
            self._unhandled.pop(0)

    # ----- the search's storage away for a while (a database server restarting) -----

    def _storage_away(self, exc: BaseException) -> None:
        """The storage did not answer: the running trials go on (they hold their own reports
        back); the worker opens the storage again every second, for up to `RETRY_S`."""
        away = self._outage.away(close=self.driver.close)
        if away is None:
            self.say(
                f"The search storage is unavailable ({reason(exc)}); the running trials go "
                f"on, retrying for up to {RETRY_S:.0f} s"
            )
        elif away > RETRY_S:
            raise SearchStorageUnavailable(
                f"the search storage {self.search.storage} stayed unavailable for {RETRY_S:.0f} s "
                f"({reason(exc)}); the trials are checkpointed: continue the search once it "
                "is back (lightning-bridge experiment continue ID, or search-worker)"
            ) from None
        time.sleep(1.0)

    def _storage_back(self) -> None:
        away = self._outage.back()
        if away is not None:
            self.say(f"The search storage is back after {away:.0f} s")

    def _stop_all(self) -> None:
        """Start no more trials; the running ones checkpoint and stop (as on a signal)."""
        self._signals += 1
        for launched in list(self.running.values()):
            try:
                launched.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _kill_others(self, trial_id: int) -> None:
        """The experiment was killed from outside: this worker's other trials end too.
        `experiment kill` kills the trials the record shows running; one this worker started
        meanwhile (its job or process not yet recorded) would otherwise train on, alone in a
        killed experiment. A second SIGKILL to a trial the command reached changes nothing."""
        for other, launched in list(self.running.items()):
            if other != trial_id:
                with contextlib.suppress(ProcessLookupError):
                    launched.process.send_signal(signal.SIGKILL)

    def on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        force = self._signals > 1
        for launched in list(self.running.values()):
            try:
                launched.process.send_signal(signal.SIGKILL if force else signal.SIGTERM)
            except ProcessLookupError:
                pass
        if force:
            self._say_safe("Killing the running trials (a second signal)")
        else:
            self._say_safe(
                f"Stopping ({signal.Signals(signum).name}): each running trial finishes its "
                "batch, checkpoints and stops"
            )

    def _say_safe(self, message: str) -> None:
        try:
            self.say(message)
        except (OSError, RuntimeError):
            pass  # a signal arrived while printing: the message is not worth a crash

    def _beat(self) -> None:
        """Keep this worker's trials alive in the search; give back other workers' trials
        not heard of for `lost_after_s` (their machine is gone)."""
        for launched in self.running.values():
            self.driver.heartbeat(launched.spec)
        for number in self.driver.requeue_stale(self.search.lost_after_s):
            self.say(f"Search trial {number}: its worker was not heard of; pending again")

    def _fill(self) -> None:
        if not self.launcher.ready():
            return  # still importing: a trial pulled now would wait (see `WarmStarter.ready`)
        while len(self.running) < self.capacity and not self._stopping:
            spec = self.driver.next_trial()
            if spec is None:
                return
            if any(launched.spec.number == spec.number for launched in self.running.values()):
                # A trial of this worker gave itself back (a signal not this worker's stopped
                # it: `experiment pause`) before its process or job ended: it stays pending
                # and nothing else starts until that end is handled (`_ended`).
                self.driver.pause(spec)
                return
            self._launch(spec)

    # ----- one trial -----

    def _record(self, spec: TrialSpec) -> _plan.TrialRun:
        """The trial's record in this workspace: a new trial of the experiment, or (a trial
        given back earlier) the one this workspace already has, continued from its latest
        checkpoint."""
        registry, search = self.registry, self.search
        noted = spec.notes.get(self.note_key) or spec.notes.get(self._host_key) or {}
        trial_id: int | None = None
        if noted.get("experiment_id") == search.experiment_id:
            known = [t.id for t in registry.trials(search.experiment_id)]
            trial_id = noted.get("trial_id") if noted.get("trial_id") in known else None
        fresh = trial_id is None
        if trial_id is None:
            label = search.source.label if search.source is not None else None
            trial_id = registry.create_trial(
                search.experiment_id, hparams=spec.hparams, seed=spec.seed, source_checkpoint=label
            )
            self.driver.note(
                spec, self.note_key, {"experiment_id": search.experiment_id, "trial_id": trial_id}
            )
        trial = _plan.TrialRun(
            workspace=self.workspace.root,
            experiment_id=search.experiment_id,
            trial_id=trial_id,
            trial_dir=self.workspace.trial_dir(search.experiment_id, trial_id),
            continue_command=continue_command(self.workspace, search.experiment_id),
            search=SearchConnection(
                search.storage, self.driver.name, str(search.config.model.searcher.metric), spec
            ),
        )
        latest = None
        if not fresh:
            settle_checkpoints(registry, trial_id)
            latest = registry.latest_checkpoint(trial_id)
            registry.archive_metrics_after(trial_id, latest.batches if latest else 0)
        restore = trial.trial_dir / "restore"
        if latest is not None:
            trial.latest_checkpoint = str(fetch(registry, latest, restore))
        elif search.source is not None:  # every trial of the search starts from the source
            trial.warm_start = True
            if search.source.checkpoint is not None:
                trial.latest_checkpoint = str(fetch(registry, search.source.checkpoint, restore))
            elif search.source.directory is not None:
                trial.latest_checkpoint = str(search.source.directory)
        return trial

    def _launch(self, spec: TrialSpec) -> None:
        trial = self._record(spec)
        search = self.search
        config = ResolvedConfig(
            search.config.raw, search.config.model, search.config.space, spec.hparams
        )
        plan = _plan.prepare_config(config, search.context_dir, search.options)
        gpus: list[str] = []
        if self._gpus:
            taken = {g for launched in self.running.values() for g in launched.gpus}
            gpus = [g for g in self._gpus if g not in taken][: self.processes]
        process = self.launcher.start(self.registry, plan, trial, devices=gpus)
        if self.slurm_job is not None:  # the trial runs in this worker's job (as a step would)
            self.registry.job_submitted(trial.trial_id, "slurm", *self.slurm_job)
            self._job_state(trial.trial_id, "RUNNING")
        self._start(spec, trial, process, gpus, own_job=self.launcher.scheduler_places)

    def _part_end(self, code: int) -> str:
        """How a trial's part of this worker's job ended: CANCELLED when the job is being
        cancelled (`experiment kill`, `scancel`: Slurm signals before it kills, so the trial
        may still checkpoint and exit 0), else COMPLETED or FAILED by its exit code."""
        if self.environment.ending_for_good():  # not a requeue
            return "CANCELLED"
        return "COMPLETED" if code == 0 else "FAILED"

    def _job_state(self, trial_id: int, state: str) -> None:
        """The trial's part of this worker's Slurm job, as `sacct` shows a job's steps: RUNNING
        while its process runs, then COMPLETED or FAILED by its exit code."""
        assert self.slurm_job is not None
        reason = f"a trial of search worker job {self.slurm_job[0]}"
        self.registry.job_state(trial_id, state, reason, self.environment.restarts)

    def _start(
        self,
        spec: TrialSpec,
        trial: _plan.TrialRun,
        process: TrialProcess,
        gpus: list[str],
        own_job: bool = False,
    ) -> None:
        launched = Launched(spec, trial, process, gpus, own_job)
        self.running[trial.trial_id] = launched
        self.ran.append(trial.trial_id)
        threading.Thread(
            target=lambda: self._events.put((trial.trial_id, process.wait())), daemon=True
        ).start()
        how = "continues" if trial.latest_checkpoint and not trial.warm_start else "starts"
        where = f" on GPU {','.join(gpus)}" if gpus else ""
        self.say(
            f"Trial {trial.trial_id} (search trial {spec.number}, bracket {spec.bracket}) "
            f"{how}{where}: {json.dumps(spec.hparams, default=str)}"
        )

    def _ended(self, trial_id: int, code: int) -> None:
        launched = self.running[trial_id]  # removed once handled: a retry finds it
        ended = self.registry.trial(trial_id)
        paused = ended.state == TrialState.STOPPED.value
        if paused and not self._stopping:
            # It stopped on a signal not this worker's (`experiment pause` or `kill`): the
            # experiment is paused; the trial is given back, to go on when continued.
            self.say("The experiment is paused: no other trial starts")
            self._paused = True
            if ended.message.startswith("killed"):  # `experiment kill` records it first
                self._kill_others(trial_id)
        stopping = bool(self._signals) or paused
        crashed = self.driver.lost(launched.spec, give_back=stopping)
        recorded = self.registry.trial(trial_id)
        if recorded.state == TrialState.ACTIVE.value:
            state = TrialState.STOPPED if stopping else TrialState.ERROR
            problem = self.launcher.unreachable(self.registry, trial_id)
            if problem is not None:  # every trial would fail so: start no more
                self.unreachable = problem
                state = TrialState.ERROR
                self._stop_all()
            self.registry.trial_ended(
                trial_id, state, problem or f"its process ended with code {code}", if_active=True
            )
            recorded = self.registry.trial(trial_id)
        if self.slurm_job is not None:
            self._job_state(trial_id, self._part_end(code))
        shutil.rmtree(launched.run.trial_dir / "restore", ignore_errors=True)
        line = (
            f"Trial {trial_id} (search trial {launched.spec.number}): {recorded.state} after "
            f"{recorded.batches_trained} batches"
        )
        if recorded.message:
            line += f": {recorded.message}"
        if crashed and not stopping:
            job = self.registry.job(trial_id) if launched.own_job else None
            output = job.output if job is not None else launched.run.trial_dir / "output.log"
            line += f" (its output: {output})"
        del self.running[trial_id]
        self.say(line)


def _mirrored(workspace: pathlib.Path, given: str | None) -> bool:
    """Whether this workspace's trials mirror their record into MLflow (a setting that cannot
    be read counts as no: the trial itself reports it)."""
    from lightning_bridge.tracking._settings import mlflow_installed, tracking_uri

    try:
        return mlflow_installed() and tracking_uri(workspace, given) is not None
    except BridgeError:
        return False
