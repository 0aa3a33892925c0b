"""Checkpoint storage in Determined's directory layout.

Atomic writes (temporary directory, fsync, rename, then the `latest` pointer), safe loading
(weights-only, no code runs from a file), the `trial_state.pkl` counters and retention. This
layer knows files and payload dicts, not trials: the translation layer builds the payload.
"""
