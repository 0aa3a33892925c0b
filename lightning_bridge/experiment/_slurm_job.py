"""`python -m lightning_bridge.experiment._slurm_job RUN_FILE`: the name job scripts written by
earlier versions call. It runs the Slurm job's `main` (`launch/slurm/_job.py`), as the stable
name new scripts call, `lightning_bridge.experiment.slurm_job`, does."""

# forwarding module: job scripts already on users' disks name this path.
from __future__ import annotations

import sys

from lightning_bridge.experiment.launch.slurm._job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
