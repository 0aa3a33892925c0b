"""The Slurm launcher: each trial is one `sbatch` job, placed by Slurm.

Determined's config keys keep their meaning: `resources.slots_per_trial` processes (GPUs, or
CPU cores on a partition without GPUs), `slurm.slots_per_node` of them per node (a trial with
more slots than that spans nodes: one task per process, started by `srun`, ranks from
Lightning's Slurm environment), `slurm.gpu_type` (`--gres=gpu:TYPE:N`),
`resources.resource_pool` (the partition), `slurm.sbatch_args` (passed on, last, so they win)
and `max_restarts` (the job requeues itself after a failure up to that many times; every job
is `--requeue`, so a preempted job or one whose node was lost runs again). The job runs
`python -m lightning_bridge.experiment.slurm_job RUN_FILE`, which trains the trial from its
run description and, after a requeue, continues it from its latest checkpoint. Before the time
limit Slurm sends the job `SIGNAL_DEFAULT` (SIGUSR1, 120 s before): the trial checkpoints at
its batch and the job requeues itself.

The coordinator (`run`, `experiment continue`) follows the job (`SlurmJob`, its handle, through
the contract's `run_trial`), recording its Slurm state in the experiment's record as it
changes (read with `scontrol`: a cluster may keep no accounting). Ctrl-C / SIGTERM of the
coordinator pauses the job (the trial checkpoints and stops; a second signal cancels it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._private import write_file
from lightning_bridge.experiment.config import _plan
from lightning_bridge.experiment.config._config_errors import launcher_section
from lightning_bridge.experiment.config._config_schema import SLURM_MESSAGES, SlurmSection
from lightning_bridge.experiment.launch._contract import Launcher, RunningTrial
from lightning_bridge.experiment.launch._handle import TrialProcess, settle_end
from lightning_bridge.experiment.trial_process import _execute
from lightning_bridge.experiment.trials import _workdir
from lightning_bridge.record._records import Job, Trial
from lightning_bridge.record._registry import LIVE_JOB_STATES, Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.translation.services._trial_environment import NODE_ADDRS_ENV, scontrol_fields

logger = logging.getLogger("lightning_bridge")

SIGNAL_DEFAULT = "B:USR1@120"  # sbatch --signal: the batch shell (the trial), 120 s before
POLL_S = 1.0
# What a trial's job runs (`python -m JOB_MODULE RUN_FILE`): a stable name (`slurm_job`).
JOB_MODULE = "lightning_bridge.experiment.slurm_job"
# The line a job that cannot reach a shared service ends with, in its output (`_slurm_job`).
UNREACHABLE = "lightning-bridge: error: unreachable from node"
_TIMEOUT_S = 60
# What the startup hook exported, written by a job across nodes for its batch shell to source
# before `srun` (`_slurm_job`), beside the run description.
HOOK_ENV = "startup-hook.env"


class SlurmRefused(InvalidArgumentError):
    """Slurm would not take the job (its message included)."""


def _slurm(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A Slurm client command; a missing binary is refused with the fix."""
    if shutil.which(command[0]) is None:
        raise InvalidArgumentError(
            f"--launcher slurm: {command[0]} is not on PATH; run on a Slurm login node (or "
            "install Slurm's client commands), or use --launcher local."
        )
    done = subprocess.run(
        list(command), capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        raise SlurmRefused(f"{shlex.join(command[:2])} failed: {message}")
    return done


def slurm_section(given: Any) -> SlurmSection:
    """The config's `slurm` section, validated (`SlurmSection`): InvalidArgumentError with
    the one line its first bad key gets (`SLURM_MESSAGES`)."""
    return launcher_section(SlurmSection, given, "slurm", SLURM_MESSAGES)


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """The trial's Slurm request, from Determined's config keys."""

    slots: int
    slots_per_node: int
    partition: str | None
    gpu_type: str | None
    sbatch_args: tuple[str, ...]
    max_restarts: int

    @classmethod
    def of(cls, plan: _plan.Plan) -> SlurmSettings:
        raw = plan.config.raw
        section = slurm_section(raw.get("slurm"))
        per_node, gpu_type = section.slots_per_node, section.gpu_type
        args = section.sbatch_args or []
        pool = (raw.get("resources") or {}).get("resource_pool")
        return cls(
            slots=plan.processes,
            slots_per_node=per_node or plan.processes,
            partition=str(pool) if pool else None,
            gpu_type=str(gpu_type) if gpu_type else None,
            sbatch_args=tuple(args),
            max_restarts=plan.config.model.max_restarts,
        )

    @property
    def per_node(self) -> int:
        """Processes on each node of the trial (Determined's slots_per_node is the least a
        node must have; a trial of fewer slots takes only those)."""
        return min(self.slots_per_node, self.slots)

    @property
    def nodes(self) -> int:
        return math.ceil(self.slots / self.per_node)

    def resources(self, gpus: bool) -> list[str]:
        """sbatch's options for the trial's processes: one task per process across nodes, or
        one task (Lightning starts the processes) on one node."""
        if self.nodes > 1:
            out = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.per_node}"]
            per_task = 1
        else:
            out = ["--nodes=1", "--ntasks=1"]
            per_task = self.slots
        if gpus:
            kind = f"gpu:{self.gpu_type}" if self.gpu_type else "gpu"
            out.append(f"--gres={kind}:{self.per_node}")
        else:
            out.append(f"--cpus-per-task={per_task}")
        return out


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """What `scontrol show job` says of a job."""

    state: str
    reason: str
    restarts: int

    @property
    def live(self) -> bool:
        return self.state in LIVE_JOB_STATES


def job_info(job_id: str) -> JobInfo | None:
    """The job's state, or None when Slurm no longer knows it."""
    done = _slurm("scontrol", "show", "job", "--oneliner", job_id, check=False)
    if done.returncode != 0:
        return None
    fields = scontrol_fields(done.stdout)
    reason = fields.get("Reason", "None")
    return JobInfo(
        state=fields.get("JobState", "UNKNOWN"),
        reason="" if reason == "None" else reason,
        restarts=int(fields.get("Restarts", "0") or 0),
    )


@dataclasses.dataclass
class JobWatch:
    """A job followed poll by poll: the one place that reads a job's state to follow it and
    tells its changes. `follow_job` polls one job until it ends; a search's worker-job
    coordinator polls several in turn, between its other work."""

    job_id: str
    last: JobInfo | None = None  # the last state seen while Slurm knew the job

    def poll(
        self, on_change: Callable[[JobInfo | None, JobInfo | None], None] | None = None
    ) -> JobInfo | None:
        """The job's state now (None: Slurm no longer knows it); `on_change(info, last)`
        first when it changed since the last poll."""
        info = job_info(self.job_id)
        if on_change is not None and (info is None or info != self.last):
            on_change(info, self.last)
        if info is not None:
            self.last = info
        return info


def follow_job(
    job_id: str,
    on_change: Callable[[JobInfo | None, JobInfo | None], None] | None = None,
    timeout: float | None = None,
    interval: float = POLL_S,
) -> JobInfo | None:
    """Poll the job (`scontrol show job`) until it ends, or until `timeout` seconds passed;
    `on_change(info, last)` each time its state changes (`info` None: Slurm no longer knows
    it). The last state seen (None: gone). The one loop that follows a job to its end."""
    deadline = None if timeout is None else time.monotonic() + timeout
    watch = JobWatch(job_id)
    while True:
        info = watch.poll(on_change)
        if info is None or not info.live:
            return info
        if deadline is not None and time.monotonic() >= deadline:
            return info
        time.sleep(interval)


def _recorder(
    registry: Registry, trial_id: int, job_id: str, say_requeued: bool = False
) -> Callable[[JobInfo | None, JobInfo | None], None]:
    """`follow_job`'s `on_change` that records the job's state for the trial as it changes
    (and logs a requeue, `say_requeued`)."""

    def record(info: JobInfo | None, last: JobInfo | None) -> None:
        if info is None:
            registry.job_state(trial_id, "GONE", "no longer known to Slurm")
            return
        registry.job_state(trial_id, info.state, info.reason, info.restarts)
        if say_requeued and last is not None and info.restarts > last.restarts:
            logger.info("Slurm job %s was requeued (%s)", job_id, info.reason)

    return record


def signal_job(job_id: str, signum: int | None) -> None:
    """`scancel`: send the job's processes (batch shell and steps) `signum`, or cancel it."""
    command = ["scancel", job_id] if signum is None else ["scancel", "--full"]
    if signum is not None:
        command += [f"--signal={signal.Signals(signum).name.removeprefix('SIG')}", job_id]
    _slurm(*command, check=False)


def sbatch(
    script: pathlib.Path, *, name: str, chdir: pathlib.Path, options: list[str], what: str
) -> tuple[str, pathlib.Path]:
    """Submit `script` as job `name`, started in `chdir` with the submitting environment, its
    output appended to `slurm-JOBID.out` beside the script; the job id and that file. Slurm's
    refusal (`what` names the job) is raised with its message."""
    output = script.parent / "slurm-%j.out"
    submit = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--chdir={chdir}",
        f"--output={output}",
        "--open-mode=append",
        "--export=ALL",
        *options,
        str(script),
    ]
    done = _slurm(*submit, check=False)
    if done.returncode != 0:
        raise SlurmRefused(f"sbatch refused {what}: {(done.stderr or done.stdout).strip()}")
    job_id = done.stdout.strip().split(";")[0]
    return job_id, pathlib.Path(str(output).replace("%j", job_id))


class SlurmLauncher(Launcher):
    """One `sbatch` job per trial (see the module docstring)."""

    name = "slurm"
    several_machines = True
    scheduler_places = True
    config_keys = ("slurm", "resources.resource_pool", "max_restarts")

    def __init__(self) -> None:
        self.gpus: bool | None = None

    # ----- refusals, before anything is recorded or submitted -----

    def check_worker_jobs(self, plan: _plan.Plan, count: int | None) -> None:
        """A search's trials in `count` worker jobs (`_slurm_workers`): each runs trials on
        one node."""
        if count is None:
            return
        if count < 1:
            raise InvalidArgumentError(f"--worker-jobs: expected a positive count, got {count}")
        settings = SlurmSettings.of(plan)
        if settings.nodes > 1:
            raise InvalidArgumentError(
                f"--worker-jobs: a trial of {settings.slots} slots spans {settings.nodes} "
                f"nodes (slurm.slots_per_node {settings.slots_per_node}), and a worker job runs "
                "trials on one node; leave --worker-jobs out (each trial is then a job of its "
                "own)"
            )

    def check(self, plan: _plan.Plan) -> None:
        settings = SlurmSettings.of(plan)
        if shutil.which("sbatch") is None:
            raise InvalidArgumentError(
                "--launcher slurm: sbatch is not on PATH; run on a Slurm login node (or "
                "install Slurm's client commands), or use --launcher local."
            )
        listed = _slurm("sinfo", "--noheader", "--Node", "--format=%N|%P|%c|%G").stdout
        nodes: list[tuple[str, str, int, int]] = []
        for line in listed.splitlines():
            name, part, cpus, gres = (line.split("|") + ["", "", "0", ""])[:4]
            nodes.append((name, part.rstrip("*"), int(cpus or 0), _gpu_count(gres)))
        partitions = sorted({p for _, p, _, _ in nodes})
        if settings.partition is not None and settings.partition not in partitions:
            raise InvalidArgumentError(
                f"resources.resource_pool: {settings.partition!r} is not a partition of this "
                f"Slurm cluster (sinfo lists: {', '.join(partitions) or 'none'}); set it to one "
                "of them, or leave it out for the default partition."
            )
        default = _default_partition(listed)
        wanted = settings.partition or default
        members = [n for n in nodes if wanted is None or n[1] == wanted]
        accelerator = (plan.options.accelerator or "auto").lower()
        self.gpus = accelerator in ("gpu", "cuda") or (
            accelerator == "auto" and any(n[3] for n in members)
        )
        unit = "GPUs" if self.gpus else "CPUs"
        have = {n[0]: (n[3] if self.gpus else n[2]) for n in members}
        if not any(count >= settings.slots_per_node for count in have.values()):
            shown = ", ".join(f"{k} {v}" for k, v in sorted(have.items())) or "no nodes"
            raise InvalidArgumentError(
                f"slurm.slots_per_node: {settings.slots_per_node} {unit} per node, but no node "
                f"of partition {wanted} has that many ({shown}); lower slurm.slots_per_node "
                "(a trial with more slots than that spans nodes) or choose another "
                "resources.resource_pool."
            )
        probe = ["sbatch", "--test-only", *self.job_options(settings), "--wrap=true"]
        done = _slurm(*probe, check=False)
        if done.returncode != 0:
            raise SlurmRefused(
                f"Slurm refuses the trial's job ({shlex.join(self.job_options(settings))}): "
                f"{(done.stderr or done.stdout).strip()}; fix slurm.sbatch_args, "
                "resources.slots_per_trial or resources.resource_pool."
            )

    def job_options(self, settings: SlurmSettings) -> list[str]:
        """sbatch's options for a job that runs one trial at a time (its resources, partition,
        requeue, the time limit's signal, then `slurm.sbatch_args`)."""
        out = settings.resources(bool(self.gpus))
        if settings.partition:
            out.append(f"--partition={settings.partition}")
        out.append("--requeue")  # preempted or its node lost: Slurm runs it again
        if not any(a.startswith("--signal") for a in settings.sbatch_args):
            out.append(f"--signal={SIGNAL_DEFAULT}")
        return [*out, *settings.sbatch_args]

    def running(self, trial: Trial, job: Job | None) -> RunningTrial | None:
        """The trial's recorded job while Slurm has it (pending or running)."""
        if job is None or job.state not in LIVE_JOB_STATES:
            return None
        return RunningJob(job.job_id)

    def unreachable(self, registry: Registry, trial_id: int) -> str | None:
        job = registry.job(trial_id)
        return unreachable_in(pathlib.Path(job.output)) if job is not None else None

    # ----- one trial -----

    def submit(self, plan: _plan.Plan, trial: _plan.TrialRun) -> tuple[str, pathlib.Path]:
        """Write the trial's run description and job script, `sbatch` it; the job id and
        its output file."""
        settings = SlurmSettings.of(plan)
        if self.gpus is None:
            self.check(plan)
        trial.trial_dir.mkdir(parents=True, exist_ok=True)
        if settings.nodes > 1:  # each node runs `per_node` of the trial's processes
            options = dataclasses.replace(
                plan.options, devices=settings.per_node, num_nodes=settings.nodes
            )
            plan = dataclasses.replace(plan, options=options)
        _execute.describe_run(plan, trial).write(trial.run_file)
        # A search's trial runs in its own copy of the folder, there before any task starts.
        _workdir.prepare_work_dir(plan, trial)
        script = trial.trial_dir / "job.sh"
        command = [sys.executable, "-m", JOB_MODULE]
        command.append(str(trial.run_file))
        lines = [
            "#!/bin/bash",
            f"# lightning-bridge: experiment {trial.experiment_id}, trial {trial.trial_id}",
        ]
        if settings.nodes == 1:
            lines.append(f"exec {shlex.join(command)}")
        else:
            # Every node's address, in node-rank order (`get_cluster_info().container_addrs`);
            # the rendezvous is the first one's: node names need not resolve.
            lines += [
                "addrs=()",
                'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
                '  addrs+=("$(scontrol show node "$node" | grep -o "NodeAddr=[^ ]*" | cut -c10-)")',
                "done",
                f'{NODE_ADDRS_ENV}=$(IFS=,; echo "${{addrs[*]}}")',
                'MASTER_ADDR="${addrs[0]}"',
                f"export MASTER_ADDR {NODE_ADDRS_ENV}",
                # Before any task reads the run description: its services checked, and a
                # requeued job's description names the trial's latest checkpoint. The startup
                # hook runs here, once: srun gives every task the environment it exported.
                f"{shlex.join([*command[:-1], '--before-tasks', command[-1]])} || exit $?",
                f"source {shlex.quote(str(trial.run_file.with_name(HOOK_ENV)))}",
                f"exec srun --kill-on-bad-exit=1 {shlex.join(command)}",
            ]
        write_file(script, "\n".join(lines) + "\n")
        return sbatch(
            script,
            name=f"lb-{trial.experiment_id}-{trial.trial_id}",
            chdir=trial.working_dir(plan),
            options=self.job_options(settings),
            what=f"trial {trial.trial_id}'s job",
        )

    def start(
        self,
        registry: Registry,
        plan: _plan.Plan,
        trial: _plan.TrialRun,
        devices: Sequence[str] = (),
    ) -> SlurmJob:
        """Submit the trial; the job, for its worker or `run_trial` to follow (Slurm places
        it: `devices` is not this machine's to give)."""
        job_id, output = self.submit(plan, trial)
        registry.job_submitted(trial.trial_id, self.name, job_id, str(output))
        return SlurmJob(job_id, registry.workspace.root, trial.trial_id, output)


class RunningJob(RunningTrial):
    """A recorded trial's live Slurm job, as `experiment pause | kill` reaches it."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.key = f"Slurm job {job_id}"

    def stop(self, registry: Registry, trial_id: int, kill: bool, signal_it: bool) -> str:
        info = job_info(self.job_id)
        if not kill and info is not None and info.state == "PENDING":
            # Nothing runs yet that could checkpoint: the trial is recorded paused first (so
            # its coordinator takes the job's end for a pause), then its job is cancelled;
            # `continue` submits it again.
            registry.trial_ended(
                trial_id,
                TrialState.STOPPED,
                f"paused while its Slurm job {self.job_id} was pending",
                if_active=True,
            )
            signal_job(self.job_id, None)
            return f"{self.key}, pending: cancelled"
        if signal_it:
            signal_job(self.job_id, None if kill else signal.SIGTERM)
        return self.key

    def wait_stopped(self) -> None:
        follow_job(self.job_id, timeout=120, interval=0.5)

    def describe(self) -> str:
        """The job's state as Slurm reports it now (pending, running, ...)."""
        info = job_info(self.job_id)
        return f"{self.key}, {info.state if info is not None else 'state unknown'}"


class SlurmJob(TrialProcess):
    """A submitted trial's job (`TrialProcess`): followed by polling Slurm, its state
    recorded in the workspace's record as it changes; paused with SIGTERM to the job's
    processes, killed by cancelling it."""

    def __init__(
        self, job_id: str, workspace: pathlib.Path, trial_id: int, output: pathlib.Path
    ) -> None:
        self.job_id = job_id
        self._workspace = workspace
        self._trial_id = trial_id
        self.output = output

    def wait(self) -> int:
        with Registry(self._workspace) as registry:  # this thread's own connection
            info = follow_job(self.job_id, _recorder(registry, self._trial_id, self.job_id))
        return _code(info)

    def send_signal(self, sig: int) -> None:
        signal_job(self.job_id, None if sig == signal.SIGKILL else sig)

    def announce(self) -> str:
        return (
            f"Trial {self._trial_id}: Slurm job {self.job_id} submitted; its output: {self.output}"
        )

    def follow(self, registry: Registry) -> int:
        """Poll the job to its end, recording its state (and logging a requeue)."""
        recorder = _recorder(registry, self._trial_id, self.job_id, say_requeued=True)
        return _code(follow_job(self.job_id, recorder))

    def stopping(self, kill: bool) -> str:
        if kill:
            return f"Cancelling Slurm job {self.job_id}"
        return f"Pausing Slurm job {self.job_id}: the trial checkpoints and stops"

    def settle(self, registry: Registry, trial_id: int, code: int, paused: bool) -> int:
        return _outcome(registry, trial_id, self.job_id, self.output, paused)


def _code(info: JobInfo | None) -> int:
    """A job's exit code as its follower sees it: 0 once COMPLETED, else 1."""
    return 0 if info is not None and info.state == "COMPLETED" else 1


def _outcome(
    registry: Registry, trial_id: int, job_id: str, output: pathlib.Path, paused: bool
) -> int:
    """The exit code of a trial whose job ended: its recorded end, or (the job ended without
    the trial recording one: killed, cancelled, its node lost) ERROR / STOPPED."""
    job = registry.job(trial_id)
    state = job.state if job is not None else "UNKNOWN"
    problem = unreachable_in(output)
    if problem is not None:  # its node could not reach the record or the search's storage
        return settle_end(registry, trial_id, None, problem)
    failed = (
        f"its Slurm job {job_id} ended {state} without the trial recording an end; "
        f"its output: {output}"
    )
    return settle_end(
        registry, trial_id, f"Slurm job {job_id} cancelled" if paused else None, failed
    )


def unreachable_in(output: pathlib.Path) -> str | None:
    """The message of a job that could not reach a shared service from its node (its output's
    `UNREACHABLE` line, without the `lightning-bridge: error: ` prefix), else None."""
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line for line in lines if line.startswith(UNREACHABLE)]
    return found[-1].removeprefix("lightning-bridge: error: ") if found else None


def _gpu_count(gres: str) -> int:
    """GPUs in sinfo's %G (`gpu:a100:4(S:0-1)`, `gpu:2`, `(null)`)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts and parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _default_partition(listed: str) -> str | None:
    for line in listed.splitlines():
        part = (line.split("|") + ["", ""])[1]
        if part.endswith("*"):
            return part.rstrip("*")
    return None
