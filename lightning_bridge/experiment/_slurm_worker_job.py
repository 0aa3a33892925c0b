"""`python -m lightning_bridge.experiment._slurm_worker_job WORKSPACE ID`: the stable name every
search worker job script calls (`searches/_slurm_workers.py` writes it; scripts written by
earlier revisions name it too), so that a worker job queued or requeued across an update still
starts while the modules behind it move. It runs the worker job's `main`
(`searches/_slurm_worker_job.py`).

It stays while worker job scripts name it; it may go only once they name the module behind it
and no script written before can still run.
"""

# forwarding module: worker job scripts name this path.
from __future__ import annotations

import sys

from lightning_bridge.experiment.searches._slurm_worker_job import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
