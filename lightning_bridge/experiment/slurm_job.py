"""The entry point of a trial's Slurm job: `python -m lightning_bridge.experiment.slurm_job
RUN_FILE` (or `--before-tasks RUN_FILE` in the batch shell of a job across nodes).

The name job scripts use, kept stable while the modules behind it move: it runs the job's
`main` (`launch/slurm/_job.py`), which trains the trial from its run description. Job scripts
written by earlier versions call `python -m lightning_bridge.experiment._slurm_job`, which
runs the same.
"""

# forwarding module: the stable name new job scripts call.
from __future__ import annotations

import sys

from lightning_bridge.experiment.launch.slurm._job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
