"""A search: the commands that start, join and continue one (`_search`), the coordinator that
hands its trials to a launcher and follows them (`_coordinator`), and its worker jobs on
Slurm (`_slurm_workers`, and `_slurm_worker_job`, what such a job runs)."""
