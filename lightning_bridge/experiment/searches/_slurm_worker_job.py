"""What a search's Slurm worker job runs (`_slurm_workers`):
`python -m lightning_bridge.experiment._slurm_worker_job WORKSPACE ID` (a name that forwards
here, kept stable for the job scripts on disk).

A search worker (`SearchWorker`) serving the recorded search `ID` of `WORKSPACE` from this
allocation, its trials forked from a warm process, until the search is finished or the job is
stopped. It first reaches the services every trial reports to (the record, the search's
storage): one this node cannot reach ends the job at once with the `UNREACHABLE` line the
coordinator shows. Each trial it starts is recorded with this job (its id and output file).
SIGTERM (`experiment pause`, `scontrol requeue`, a preemption) stops its trials, checkpointed,
and gives them back to the search; SIGUSR1 (the time limit's `--signal`) does the same, and
the job then requeues itself.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import socket
import sys
from typing import Any

from lightning_bridge._errors import BridgeError
from lightning_bridge.experiment.config._config import parse_config
from lightning_bridge.experiment.launch.slurm._job import _requeue
from lightning_bridge.experiment.launch.slurm._launcher import UNREACHABLE, _slurm
from lightning_bridge.experiment.searches._search_to_serve import (
    SearchToServe,
    launched_by,
    search_storage_url,
)
from lightning_bridge.experiment.searches._worker import (
    SearchStorageUnavailable,
    SearchWorker,
)
from lightning_bridge.experiment.trial_process._exit_codes import EXIT_UNREACHABLE
from lightning_bridge.experiment.trials._source_checkpoint import warm_start_source
from lightning_bridge.record._registry import Registry
from lightning_bridge.search import SearchDriver
from lightning_bridge.search._storage import import_optuna
from lightning_bridge.search._storage_check import check_search_storage
from lightning_bridge.translation.services._trial_environment import (
    SlurmJobEnvironment,
    scontrol_fields,
)


def main(argv: list[str]) -> int:
    """A search worker in its Slurm job: serve the recorded search `ID` of `WORKSPACE` from
    this allocation, forking its trials from a warm process, until the search is finished or
    the job is stopped."""
    parser = argparse.ArgumentParser(prog="lightning_bridge.experiment._slurm_worker_job")
    parser.add_argument("workspace", type=pathlib.Path)
    parser.add_argument("experiment_id", type=int)
    parser.add_argument("--lost-after", type=float, default=300.0)
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    node = socket.gethostname()
    try:  # the services every trial reports to, from this node
        registry = Registry(args.workspace)
        experiment = registry.experiment(args.experiment_id)
        recorded = experiment.options["search"]
        storage = search_storage_url(registry, args.experiment_id, recorded)
        import_optuna()
        check_search_storage(storage, str(recorded["name"]))
    except Exception as exc:  # noqa: BLE001 - the drivers' own errors too
        print(f"{UNREACHABLE} {node}: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNREACHABLE  # not requeued: the next run would fail the same way
    near_limit: list[int] = []
    with registry:
        driver = SearchDriver(storage, str(recorded["name"]), job=job_id or None)
        try:
            config = parse_config(experiment.config)
            options = launched_by(experiment.options, "local")  # no worker jobs of its own
            search = SearchToServe(
                args.experiment_id,
                config,
                pathlib.Path(experiment.context_dir),
                options,
                storage,
                warm_start_source(registry, config.model.searcher),
                float(args.lost_after),
            )
            worker = SearchWorker(
                registry,
                driver,
                search,
                slurm_job=(job_id, _output_of(job_id)),
                environment=SlurmJobEnvironment(job_id=job_id, restart_count=restarts),
            )

            def on_usr1(signum: int, frame: Any) -> None:
                near_limit.append(signum)
                worker.on_signal(signal.SIGTERM, frame)

            signal.signal(signal.SIGUSR1, on_usr1)
            print(f"Search worker in Slurm job {job_id} on {node}", flush=True)
            try:
                finished = worker.serve()
            except SearchStorageUnavailable as exc:
                print(f"lightning-bridge: error: {exc}", file=sys.stderr, flush=True)
                return 1
        except BridgeError as exc:
            print(f"lightning-bridge: error: {exc}", file=sys.stderr, flush=True)
            return 2
        finally:
            driver.close()
    if near_limit and not finished:
        _requeue("its time limit is near: its trials checkpointed")
    return 0


def _output_of(job_id: str) -> str:
    """This job's output file, as Slurm names it (`scontrol show job`'s StdOut)."""
    done = _slurm("scontrol", "show", "job", "--oneliner", job_id, check=False)
    return scontrol_fields(done.stdout).get("StdOut", "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
