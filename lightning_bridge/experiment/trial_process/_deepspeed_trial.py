"""One process of a multi-process `DeepSpeedTrial` run by `lightning-bridge run`.

torchrun starts one of these per process (DeepSpeed's process group is torchrun's, as
`python3 -m determined.launch.deepspeed` gave it on Determined); each loads the trial class
the run's description names, from its working directory, and trains it.
"""

from __future__ import annotations

import pathlib

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config._entrypoint import parse_entrypoint
from lightning_bridge.experiment.trial_process._execute import load_trial_class, run_trial_class
from lightning_bridge.translation.services._run_description import RunDescription


def main() -> None:
    run = RunDescription.current()
    spec = parse_entrypoint(run.entrypoint).trial if run is not None else None
    if run is None or spec is None:
        raise InvalidArgumentError(
            "This module runs a DeepSpeedTrial's process for `lightning-bridge run`; start "
            "the trial with `lightning-bridge run const.yaml`."
        )
    run_trial_class(load_trial_class(spec, pathlib.Path.cwd()), run)


if __name__ == "__main__":
    main()
