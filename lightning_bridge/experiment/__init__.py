"""Experiments: the `lightning-bridge` command and what it runs.

The experiment config (parsed and validated), the entrypoint runner (trial classes in
process, scripts as subprocesses under torchrun), the `determined` import mapping for
unchanged trial code, and the command line itself.
"""
