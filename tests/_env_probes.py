"""Trials and scripts that record what their processes see of the environment, for the
tests of `environment.environment_variables` on each launcher."""

# A script that writes what its process sees of the environment to env.RANK.json.
PROBE_PY = """
import json
import os

names = ["FROM_SHELL", "OVERRIDDEN", "HOOKED", "DUP", "WITH_EQ", "DEVICE", "RANK", "HF_TOKEN"]
rank = os.environ.get("RANK", "0")
with open(f"env.{rank}.json", "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
"""

# The linear trial, recording the same variables from its __init__ (a trial class entrypoint,
# trained in the trial's own process), in OUT/env.<lr>.json (a search's trial runs in a copy
# of the folder).
TRIAL_PROBE = """
import json
import os

from model_def import LinearTrial


class ProbeTrial(LinearTrial):
    def __init__(self, context):
        super().__init__(context)
        names = ["FROM_SHELL", "OVERRIDDEN", "HOOKED", "DEVICE", "RANK"]
        name = context.get_hparams().get("name") or context.get_hparam("lr")
        rank = context.distributed.rank
        out = os.path.join(context.get_hparam("out"), f"env.{name}.{rank}.json")
        with open(out, "w") as f:
            json.dump({n: os.environ.get(n) for n in names}, f)
"""

HOOK = 'export HOOKED="$OVERRIDDEN-hook"\nexport DUP=from-hook\n'
