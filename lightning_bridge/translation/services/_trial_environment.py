"""`TrialEnvironment`: what the launcher that started a trial's process tells that process.

The launcher's side of a trial has three parts (DESIGN.md, "Where trials run"): the launcher
starts the trial, a handle answers for it from outside, and this environment answers inside
every process of the trial: was it requeued, how many restarts, its nodes' addresses, which
signal means "time is short", and whether the trial keeps its search trial when it stops or
fails. That last answer belongs to whoever started the process (one owner of the claim): the
process that starts the trial writes its environment into `ENV_VAR` (`export_to`), and every
process it starts inherits it (a script entrypoint's process, torchrun's ranks), so a trial
asks the same question with the same answer wherever its fit runs. Without `ENV_VAR` the trial
runs under the local launcher: a stopped trial gives its search trial back, a failed one fails
it.

An environment variable rather than the run description: the description is written once by
the coordinator, before the trial is placed, and says what the trial is; this says where and
how the current run of it was started (a job's id and restart count, the file its time-limit
signal is noted in), which only the starting process knows and which changes with each run
of one description.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import subprocess
from collections.abc import Mapping

logger = logging.getLogger("lightning_bridge")

ENV_VAR = "LIGHTNING_BRIDGE_TRIAL_ENVIRONMENT"
# The addresses of a trial's nodes in node-rank order, comma-separated, when a launcher spreads
# it over several (a Slurm job across nodes exports them); unset: one machine.
NODE_ADDRS_ENV = "LIGHTNING_BRIDGE_NODE_ADDRS"
_SCONTROL_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class TrialEnvironment:
    """A trial's process as the local launcher starts it (see the module docstring); a
    launcher that runs a trial again itself subclasses it (`SlurmJobEnvironment`)."""

    kind = "local"

    @property
    def restarts(self) -> int:
        """How many times this run's starter ran the trial before (0: the first run)."""
        return 0

    @property
    def requeued(self) -> bool:
        return self.restarts > 0

    # Whether a stop signal before the fit takes it is held until it does (`_signals.
    # held_until_training`): a launcher that pauses trials from afar, where the signal may
    # come while the trial still imports.
    holds_early_stop = False

    @property
    def node_addrs(self) -> list[str]:
        """The trial's nodes' addresses in node-rank order; one machine: this one."""
        named = os.environ.get(NODE_ADDRS_ENV, "")
        return [a.strip() for a in named.split(",") if a.strip()] or ["127.0.0.1"]

    @property
    def time_short_signal(self) -> int | None:
        """The signal that means "time is short: checkpoint and stop" (None: none)."""
        return None

    def keeps_search_trial(self, failed: bool) -> str | None:
        """Why this process's trial stays its search trial's (alive in the search, under
        the same pull) after a signal stopped it (`failed` False) or it failed (`failed`
        True): its starter runs it again itself. None: the trial gives its search trial back
        (stopped) or fails it (failed), as the local launcher's starter runs it no more."""
        return None

    def ending_for_good(self) -> bool:
        """Whether what runs this process (its job) is being ended for good (`experiment
        kill`, `scancel`) rather than run again; the local launcher's: never (a process is
        killed outright)."""
        return False

    # ----- passing it on -----

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def export_to(self, environ: dict[str, str] | os._Environ[str]) -> None:
        """Name this environment in `environ` (this process's: the trial's processes started
        from here inherit it)."""
        environ[ENV_VAR] = json.dumps(self.to_json(), sort_keys=True)

    @staticmethod
    def current() -> TrialEnvironment:
        """This process's environment, as its starter exported it (the local launcher's
        when none did)."""
        text = os.environ.get(ENV_VAR)
        if not text:
            return TrialEnvironment()
        data = dict(json.loads(text))
        kind = _KINDS.get(str(data.pop("kind", "local")), TrialEnvironment)
        names = {f.name for f in dataclasses.fields(kind)}
        return kind(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass(frozen=True)
class SlurmJobEnvironment(TrialEnvironment):
    """A trial's process in the Slurm job that runs the trial (`_slurm_job`): the job is
    `--requeue`d, so it runs the trial again itself when Slurm requeues it (`scontrol
    requeue`, a preemption), when it requeues itself after its time limit's signal
    (`time_short`, noted in `signal_note` by the job), and after a failure while its restarts
    are under `max_restarts`."""

    kind = "slurm"

    job_id: str = ""
    restart_count: int = 0
    max_restarts: int = 0
    time_short: str = "SIGUSR1"
    signal_note: str = ""  # the file the job writes once its time limit's signal came

    @property
    def restarts(self) -> int:
        return self.restart_count

    @property
    def time_short_signal(self) -> int | None:
        import signal

        return int(signal.Signals[self.time_short])

    def note_time_short(self) -> None:
        """The job got its time limit's signal: every process of the trial learns it."""
        if self.signal_note:
            pathlib.Path(self.signal_note).write_text(self.time_short + "\n")

    def time_is_short(self) -> bool:
        return bool(self.signal_note) and pathlib.Path(self.signal_note).is_file()

    def ending_for_good(self) -> bool:
        """The job is being cancelled, not requeued: Slurm shows it CANCELLED (or
        COMPLETING) without a restart beyond this run's (it counts a requeue before it
        signals the job)."""
        fields = slurm_job_fields(self.job_id) if self.job_id else None
        if fields is None or fields.get("JobState") not in ("CANCELLED", "COMPLETING"):
            return False
        return int(fields.get("Restarts", "0") or 0) <= self.restart_count

    def keeps_search_trial(self, failed: bool) -> str | None:
        if not self.job_id:
            return None
        if failed:
            if self.restart_count >= self.max_restarts:
                return None
            return (
                f"Slurm job {self.job_id} requeues itself after the failure (restart "
                f"{self.restart_count + 1} of max_restarts {self.max_restarts}) and continues it"
            )
        if self.time_is_short():  # the job requeues itself once the trial stopped
            return (
                f"its time limit is near: Slurm job {self.job_id} requeues itself and continues it"
            )
        restarts = slurm_job_restarts(self.job_id)
        # Slurm counts a requeue before it signals the job: a count above this run's means
        # the job is being requeued (a pause or a cancellation leaves it).
        if restarts is None or restarts <= self.restart_count:
            return None
        return f"Slurm job {self.job_id} is requeued (restart {restarts}) and continues it"


def slurm_job_fields(job_id: str) -> dict[str, str] | None:
    """What `scontrol show job` says of the job, field by field; None when Slurm no longer
    knows it (or `scontrol` is not on PATH)."""
    if shutil.which("scontrol") is None:
        return None
    done = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id],
        capture_output=True,
        text=True,
        timeout=_SCONTROL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        return None
    return scontrol_fields(done.stdout)


def scontrol_fields(oneliner: str) -> dict[str, str]:
    """`scontrol show ... --oneliner`'s `Key=Value` words as a mapping (the first of a key)."""
    fields: dict[str, str] = {}
    for word in oneliner.split():
        key, _, value = word.partition("=")
        fields.setdefault(key, value)
    return fields


def slurm_job_restarts(job_id: str) -> int | None:
    """How many times Slurm has requeued the job (None: it no longer knows the job)."""
    fields = slurm_job_fields(job_id)
    return None if fields is None else int(fields.get("Restarts", "0") or 0)


def is_chief(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is its trial's chief (rank 0, local rank 0), from the variables
    a launcher sets for the others: Lightning's launcher and torchrun (`RANK`, `LOCAL_RANK`),
    a Slurm job of several tasks (`RANK` from `SLURM_PROCID`, see `_slurm_job`), a node of a
    trial across Ray nodes (`NODE_RANK`: each node's first process is Lightning's to expand).
    The chief records, reports and prints what every process shares."""
    return all(
        int(environ.get(name, "0") or 0) == 0 for name in ("LOCAL_RANK", "RANK", "NODE_RANK")
    )


@dataclasses.dataclass(frozen=True)
class RayEnvironment(TrialEnvironment):
    """A trial's process placed by the Ray launcher (`launch/ray`): the coordinator that
    placed it runs it again itself, on another node where its node was lost (the process is
    gone then and asks nothing) or is being drained (the process, stopped by it, keeps its
    search trial), and after a failure while its restarts are under `max_restarts`; another
    stop signal (`experiment pause`, the coordinator's Ctrl-C) gives the trial back."""

    kind = "ray"
    holds_early_stop = True

    placement: str = ""  # the trial's actors' name on the cluster
    restart_count: int = 0
    max_restarts: int = 0
    # A file the launcher writes before it stops the trial because its node is being drained.
    drain_marker: str = ""

    @property
    def restarts(self) -> int:
        return self.restart_count

    def keeps_search_trial(self, failed: bool) -> str | None:
        if not failed and self.drain_marker and pathlib.Path(self.drain_marker).is_file():
            return "its Ray node is being drained: the Ray launcher runs it again on another node"
        if not failed or self.restart_count >= self.max_restarts:
            return None
        return (
            f"the Ray launcher runs it again (restart {self.restart_count + 1} of "
            f"max_restarts {self.max_restarts})"
        )


_KINDS: dict[str, type[TrialEnvironment]] = {
    TrialEnvironment.kind: TrialEnvironment,
    SlurmJobEnvironment.kind: SlurmJobEnvironment,
    RayEnvironment.kind: RayEnvironment,
}
