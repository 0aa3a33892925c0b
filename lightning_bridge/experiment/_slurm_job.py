"""`python -m lightning_bridge.experiment._slurm_job RUN_FILE`: the name a trial's Slurm job
scripts written before the stable name existed call. A job still queued, or requeued (it runs
its script again), when the package is updated still runs its trial through this path. It
runs the Slurm job's `main` (`launch/slurm/_job.py`), as the stable name new scripts call,
`lightning_bridge.experiment.slurm_job`, does.

It may go with the first release, once no job script written before it can still run: no
released version wrote one.
"""

# forwarding module: job scripts already on users' disks name this path.
from __future__ import annotations

import sys

from lightning_bridge.experiment.launch.slurm._job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
