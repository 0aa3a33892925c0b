"""Running a search's trials (the searchers themselves are `lightning_bridge.search`): a search
to serve, the one value its commands build (`_search_to_serve`); its worker, which pulls the
search's trials, hands each to a launcher and follows it (`_worker`: `SearchWorker`); and its
worker jobs on Slurm (`_slurm_workers`, and `_slurm_worker_job`, what such a job runs). The
commands that start, join and continue a search are the commands' (`cli/_search_commands`).
"""
