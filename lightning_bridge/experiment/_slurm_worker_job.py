"""`python -m lightning_bridge.experiment._slurm_worker_job WORKSPACE ID`: the name worker job
scripts call (those written by earlier versions too), kept stable while the modules behind it
move. It runs the worker job's `main` (`searches/_slurm_worker_job.py`)."""

# forwarding module: worker job scripts name this path.
from __future__ import annotations

import sys

from lightning_bridge.experiment.searches._slurm_worker_job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
