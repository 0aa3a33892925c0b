"""Reproducible samplers, name for name those of `determined.pytorch.samplers`.

The implementation lives in the trial contract (`lightning_bridge.contract._samplers`); this is
its public path.
"""

from lightning_bridge.contract._samplers import *  # noqa: F403
from lightning_bridge.contract._samplers import __all__  # noqa: F401
