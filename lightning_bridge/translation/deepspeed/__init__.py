"""DeepSpeedTrial's runner: the trial's loop on DeepSpeed's own engine."""
