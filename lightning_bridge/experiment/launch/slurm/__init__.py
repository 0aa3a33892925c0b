"""The Slurm launcher: a job per trial (`_launcher`: sbatch, the one job poller, the job as a
handle) and what the job runs (`_job`, behind the stable name
`lightning_bridge.experiment.slurm_job`)."""
