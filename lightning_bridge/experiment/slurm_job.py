"""The entry point of a trial's Slurm job: `python -m lightning_bridge.experiment.slurm_job
RUN_FILE` (or `--before-tasks RUN_FILE` in the batch shell of a job across nodes).

The name job scripts use, kept stable while the modules behind it move: it runs
`_slurm_job.main`, which trains the trial from its run description. Job scripts written by
earlier versions call `python -m lightning_bridge.experiment._slurm_job`, which runs the same.
"""

from __future__ import annotations

import sys

from lightning_bridge.experiment._slurm_job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
