"""What a trial's Slurm job runs: `python -m lightning_bridge.experiment.slurm_job RUN_FILE`
(job scripts written before name this module, `..._slurm_job`, which runs the same `main`).

It trains the trial of the run description as `lightning-bridge _trial RUN_FILE` does, from
the run description and the trial runner alone (not through the command line), with a few
things of its own:

- A requeued job (`SLURM_RESTART_COUNT` > 0: `scontrol requeue`, a preemption, a node lost)
  continues from the trial's latest durable checkpoint, as `experiment continue` would: the
  record says which, the run description is rewritten to name it.
- A one-task job hides its Slurm task count from Lightning (`SLURM_NTASKS`), which would
  otherwise take the job for `srun`-started ranks: the processes of a one-node trial are
  Lightning's to start, as on any machine. A job of several tasks (a trial across nodes, one
  task per process) keeps it, and Lightning's Slurm environment gives ranks and world size.
- Before training (`before_training`: in its one task, or in the batch shell of a job across
  nodes before `srun` starts the tasks) the job connects to the services every trial reports
  to (the experiment record, a search's storage): one its node cannot reach ends the job at
  once with a message naming it (`UNREACHABLE`), which the coordinator shows; it stops
  submitting (`SlurmLauncher.unreachable`). A requeued job's run description is rewritten
  there too, so no task of a job across nodes reads it before.
- A job across nodes runs the folder's `startup-hook.sh` there too, once, in the working
  directory every task shares, and writes what it exported to `HOOK_ENV` (beside the run
  description) for the batch shell to source: `srun` hands that environment to every task,
  on every node, and no task runs the hook again. (A hook run by each node's first task would
  run on every node at once in the one shared working copy, and the node's other tasks,
  started by `srun` rather than by that task, would not see its exports.)
- SIGUSR1 (sbatch `--signal`, before the time limit) stops the trial as SIGTERM does (finish
  the batch, checkpoint) and then requeues the job, which continues from that checkpoint.
- A search's trial stopped because its job is requeued (the time limit's signal above, or
  `scontrol requeue` / a preemption: Slurm counted the restart before it sent SIGTERM) keeps
  its search trial: the requeued job continues it, and the search's
  coordinator, still following the same job, starts no other. Any other stop (`experiment
  pause`, the coordinator's Ctrl-C: SIGTERM without a restart) gives the trial back.
  Either signal during start-up (`experiment pause` of a trial still importing) waits until
  the fit catches SIGTERM: the trial stops after its first batch instead of dying unrecorded.
- A trial that failed requeues the job while its restarts are under `max_restarts`, and
  the requeued job continues it from its latest checkpoint. A search's trial that failed so
  keeps its search trial too; only its last failure (no restarts left) closes it as failed
  in the search. The job decides both and says so through the environment it exports to
  every process of its trial (`SlurmJobEnvironment`): a script entrypoint's process, or
  torchrun's ranks, answer as a trial class trained in the job's own process does; the time
  limit's signal, which only the job receives, is noted in a file beside the run description
  (`TIME_SHORT_NOTE`) for them.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from lightning_bridge._errors import BridgeError
from lightning_bridge._private import write_file
from lightning_bridge.experiment.config._config import parse_config
from lightning_bridge.experiment.launch.slurm._launcher import HOOK_ENV, UNREACHABLE
from lightning_bridge.experiment.trial_process._exit_codes import EXIT_UNREACHABLE, guarded
from lightning_bridge.experiment.trial_process._signals import handling
from lightning_bridge.experiment.trials._checkpoints import continue_from_latest
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._settings import WorkspaceSettings
from lightning_bridge.record._workspace import Workspace
from lightning_bridge.translation.services._run_description import RunDescription
from lightning_bridge.translation.services._trial_environment import SlurmJobEnvironment, is_chief

# The file (beside the run description, per job and run) the job notes its time limit's signal
# in, for every process of its trial (`SlurmJobEnvironment`).
TIME_SHORT_NOTE = "time-limit-signal"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def unreachable(run: RunDescription) -> str | None:
    """Why this node cannot reach a service the trial reports to (the experiment record, a
    search's storage), naming it; None when it reaches both."""
    if run.record is not None:
        workspace = Workspace(run.record.workspace)
        try:
            shared = WorkspaceSettings.read(workspace.root).record is not None
            if not shared and not workspace.registry_path.is_file():
                return (
                    f"the experiment record {workspace.registry_path} is not on this node's "
                    "file systems; put the workspace on a file system every node mounts at "
                    'the same path, with {"record": "postgresql://..."} in its workspace.json'
                )
            with Registry(workspace) as registry:
                registry.trial(run.record.trial_id)
        except BridgeError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - the driver's own errors
            return f"the experiment record of {workspace.root}: {type(exc).__name__}: {exc}"
    if run.search is not None:
        from lightning_bridge.search._storage_check import check_search_storage

        try:
            check_search_storage(run.search.storage, run.search.name)
        except BridgeError as exc:
            return f"the search storage: {exc}"
    return None


def _tasks_per_node(value: str) -> list[int]:
    """Slurm's tasks-per-node list (`2(x3),1`) expanded, one count per node of the job."""
    counts: list[int] = []
    for item in value.split(","):
        count, _, repeat = item.partition("(x")
        if count.strip().isdigit():
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts


def task_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a task of a job of several tasks (one per process) tells the trial of its place, in
    the names `DistributedContext` and `get_cluster_info()` read: its rank, its rank on its
    node, the processes on its node and its node's rank (Determined's local size and cross
    rank), and the rendezvous port of a script's process group (`MASTER_PORT`: the one
    Lightning's Slurm environment derives from the job id, so a trial class's ranks meet on
    it too). Not torchrun's GROUP_RANK: Lightning would take the job for a torchrun one."""
    node = int(environ.get("SLURM_NODEID", "0") or 0)
    counts = _tasks_per_node(
        environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    )
    job_id = environ.get("SLURM_JOB_ID", "")
    out = {
        "RANK": environ.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "NODE_RANK": str(node),
        "MASTER_PORT": environ.get("MASTER_PORT")
        or str(15000 + int(job_id[-4:]) if job_id.isdigit() else 12910),
    }
    if node < len(counts):
        out["LOCAL_WORLD_SIZE"] = str(counts[node])
    return out


def restarts_allowed(run: RunDescription) -> int:
    """How many times the job requeues its failed trial: the config's `max_restarts`, which the
    launcher wrote into the run description from the config model. A run file written before
    that field names it only in its config, which the config model reads (same default)."""
    if run.max_restarts is not None:
        return run.max_restarts
    return parse_config(run.raw_config).model.max_restarts


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


def before_training(
    run: RunDescription, run_file: pathlib.Path, restarts: int
) -> tuple[int, RunDescription]:
    """What the job does once before its trial's processes start: check the services the
    trial reports to from this node (EXIT_UNREACHABLE, with the message, when one is out of
    reach) and, in a requeued job, name the latest checkpoint in the run description. A job of
    one task does it in that task; a job across nodes in its batch shell, before `srun` starts
    the tasks, so that every task reads the description as rewritten. Its exit code (0: go
    on) and the description, as rewritten."""
    problem = unreachable(run)
    if problem is not None:
        print(f"{UNREACHABLE} {socket.gethostname()}: {problem}", file=sys.stderr, flush=True)
        return EXIT_UNREACHABLE, run  # not requeued: the next run would fail the same way
    if restarts:
        run = continue_from_latest(run, run_file)
    return 0, run


def run_hook_for_tasks(run: RunDescription, run_file: pathlib.Path) -> int:
    """The batch shell's run of the startup hook (in its working directory, the tasks'):
    its exports written to `HOOK_ENV` as `export` lines, with `RAN_ENV`; 0, or the hook's
    exit code when it failed (the job ends: no task starts; the trial is recorded ERROR with
    the hook's message, as a trial whose hook fails on one node is)."""
    from lightning_bridge._logging import configure
    from lightning_bridge.experiment.config._config import parse_config
    from lightning_bridge.experiment.trial_process._child import EntrypointFailed
    from lightning_bridge.experiment.trial_process._environment import trial_variables
    from lightning_bridge.experiment.trial_process._startup_hook import RAN_ENV, hook_exports

    configure(run.log_file)  # the hook's output: the trial's log
    # The hook sees the config's environment variables, as it does where it runs in the task.
    environment = parse_config(run.raw_config).model.environment
    accelerator = (run.options or {}).get("accelerator")
    try:
        exports = hook_exports(
            pathlib.Path.cwd(), {**os.environ, **trial_variables(environment, accelerator)}
        )
    except EntrypointFailed as exc:
        print(f"lightning-bridge: error: {exc}", file=sys.stderr, flush=True)
        if run.record is not None:
            with Registry(run.record.workspace) as registry:
                registry.trial_ended(
                    run.record.trial_id, TrialState.ERROR, str(exc), if_active=True
                )
        return exc.code if exc.code > 0 else 1
    lines = [
        f"export {k}={shlex.quote(v)}" for k, v in sorted(exports.items()) if _NAME.fullmatch(k)
    ]
    lines.append(f"export {RAN_ENV}=1")
    # The trial's environment, secrets included: created private.
    write_file(run_file.with_name(HOOK_ENV), "\n".join(lines) + "\n")
    return 0


def _train(run: RunDescription, run_file: pathlib.Path) -> int:
    """Train the trial of the run description, as `lightning-bridge _trial RUN_FILE` does but
    without the command line: the bridge's logging, then the trial runner; its exit code."""
    from lightning_bridge import _logging
    from lightning_bridge.experiment.trial_process._run import run_described

    _logging.configure()
    try:
        return guarded(lambda: run_described(run, run_file))
    except KeyboardInterrupt:  # outside training: a fit stops on SIGINT by itself
        print("lightning-bridge: interrupted (no training was running)", file=sys.stderr)
        return 128 + signal.SIGINT


def main(argv: list[str]) -> int:
    """The job: `RUN_FILE` (a task of it), or `--before-tasks RUN_FILE` (the batch shell of a
    job across nodes); its exit code. It reads the run file once and passes the description
    on (a requeued job's rewritten one too)."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    before_tasks = argv[0] == "--before-tasks"  # the batch shell of a job across nodes
    run_file = pathlib.Path(argv[1 if before_tasks else 0]).resolve()
    run = RunDescription.read(run_file)
    if before_tasks:
        code, run = before_training(run, run_file, restarts)
        return code or run_hook_for_tasks(run, run_file)
    if os.environ.get("SLURM_NTASKS", "1") == "1":
        for name in ("SLURM_NTASKS", "SLURM_NPROCS"):
            os.environ.pop(name, None)
        code, run = before_training(run, run_file, restarts)
        if code:
            return code
    else:  # one task per process: the record's writer is rank 0 (`run_described`)
        os.environ.update(task_environment(os.environ))
    job_id = os.environ.get("SLURM_JOB_ID")
    max_restarts = restarts_allowed(run)
    # This job decides whether its trial keeps its search trial: every process of the trial
    # (a script entrypoint's too) asks this environment, inherited from here.
    environment = SlurmJobEnvironment(
        job_id=job_id or "",
        restart_count=restarts,
        max_restarts=max_restarts,
        time_short="SIGUSR1",
        signal_note=str(run_file.with_name(f"{TIME_SHORT_NOTE}.{job_id}.{restarts}")),
    )
    environment.export_to(os.environ)
    received: list[int] = []  # the first stop signal: SIGUSR1 (time limit) or SIGTERM
    trained = threading.Event()  # the trial's command returned: nothing left to stop

    def on_signal(signum: int, frame: Any) -> None:
        if not received:
            received.append(signum)
            if signum == environment.time_short_signal:
                environment.note_time_short()
            stop = threading.Thread(target=_stop_when_training, args=(trained, on_signal))
            stop.daemon = True
            stop.start()

    # The fit installs its own SIGTERM handler inside; these stay until the job's end.
    with handling(on_signal, (signal.SIGUSR1, signal.SIGTERM)):
        try:
            code = _train(run, run_file)
        except SystemExit as exc:  # the fit's own exit once a signal stopped it
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            trained.set()
        if not is_chief():  # one task (or process) reads how the trial ended
            return code
        assert run.record is not None
        with Registry(run.record.workspace) as registry:
            state = registry.trial(run.record.trial_id).state
        if received == [signal.SIGUSR1] and state == TrialState.STOPPED.value:
            _requeue("its time limit is near: the trial checkpointed")
        elif code != 0 and environment.keeps_search_trial(failed=True) is not None:
            _requeue(f"the trial failed; restart {restarts + 1} of max_restarts {max_restarts}")
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
