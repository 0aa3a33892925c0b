"""The port tool: write a Determined trial folder for a Lightning project.

`lightning-bridge port pkg.module:LitModel --out DIR` inspects the module (and data module),
renders `model_def.py`, `const.yaml` and `startup-hook.sh`, and copies the user's sources.
"""
