"""What a config becomes before anything runs: the `run` command's `Options`, the validated
`Plan` (the config, the folder holding the code, the entrypoint, the options) and a `TrialRun`
(one trial's ids and folders; its seed, `trial_seed`). `prepare()` loads and checks a config
and its entrypoint without running anything (nor importing torch); the launchers, the
searches and the record's commands take a `Plan`, and the trial's process runs one
(`trial_process/_execute.py`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.config._config import ResolvedConfig, load_config
from lightning_bridge.experiment.config._entrypoint import Entrypoint, parse_entrypoint
from lightning_bridge.search._space import trial_draw
from lightning_bridge.translation._engine_settings import EngineSettings
from lightning_bridge.translation.services._run_description import SearchConnection

# The folder of a search trial's own copy of the experiment folder, in its trial folder
# (`trials/_workdir.py` makes it).
WORKDIR = "workdir"

# Seconds a script entrypoint gets to stop after SIGTERM / SIGINT (config: preemption_timeout).
DEFAULT_STOP_TIMEOUT = 300


@dataclasses.dataclass
class Options:
    """The `run` command's options."""

    overrides: list[str] = dataclasses.field(default_factory=list)
    test_mode: bool = False
    resume: str | None = None
    trust_checkpoint: bool = False
    devices: Any = None
    precision: str | None = None
    strategy: str | None = None
    accelerator: str | None = None
    # Where the record is mirrored in MLflow (None: MLFLOW_TRACKING_URI, the workspace's).
    tracking_uri: str | None = None
    launcher: str = "local"  # where trials run (`_launcher`)
    num_nodes: int | None = None  # a trial across nodes: `devices` processes on each
    # A search on Slurm: its trials run in this many long-running worker jobs
    # (`_slurm_workers`), each forking them from a warm process; None: a job per trial.
    worker_jobs: int | None = None
    # The Ray cluster's address (`--address`; `launch/ray`), recorded for `experiment
    # continue`; None: RAY_ADDRESS, else `auto`.
    address: str | None = None

    @classmethod
    def from_record(cls, recorded: dict[str, Any]) -> Options:
        """The options an experiment or a run description recorded (other keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in recorded.items() if k in names})

    def engine_settings(self) -> EngineSettings:
        """The command line's engine settings, as given."""
        return EngineSettings(
            accelerator=self.accelerator or "auto",
            devices=self.devices,
            strategy=self.strategy or "auto",
            precision=self.precision,
            num_nodes=self.num_nodes or 1,
        )


@dataclasses.dataclass
class Plan:
    """A validated run: the config, where it runs and what it runs."""

    config: ResolvedConfig
    context_dir: pathlib.Path
    entrypoint: Entrypoint
    options: Options
    accelerator: str | None = None  # the accelerator Lightning will use (set by the checks)

    @property
    def processes(self) -> int:
        """How many training processes: `--devices` when it is a number, else slots_per_trial."""
        if isinstance(self.options.devices, int):
            return self.options.devices * (self.options.num_nodes or 1)
        return self.config.model.resources.slots_per_trial

    def experiment_config(self) -> dict[str, Any]:
        return self.config.experiment_config(self.context_dir)

    def check_engine(self) -> None:
        """Check the command line's engine settings against Lightning (InvalidArgumentError
        listing the accepted values); remember the accelerator it will use. With none given
        and one process there is nothing to check (any accelerator Lightning picks holds one
        process), and the command does not import Lightning: it costs seconds of CPU."""
        options = self.options
        given = (options.accelerator, options.devices, options.strategy, options.precision)
        if self.processes == 1 and given == (None,) * 4 and (options.num_nodes or 1) == 1:
            self.accelerator = None
            return
        settings = self.options.engine_settings()
        self.accelerator = settings.check(spell=lambda name: f"--{name}")

    @property
    def stop_timeout(self) -> int:
        """Seconds a script entrypoint gets to stop after a signal before it is killed."""
        return self.config.model.preemption_timeout or DEFAULT_STOP_TIMEOUT


@dataclasses.dataclass
class TrialRun:
    """One trial of an experiment as it runs now: its ids, its folder (checkpoints, logs,
    log file, run description), the checkpoint directory it continues from, and the command
    that continues it after a stop."""

    workspace: pathlib.Path
    experiment_id: int
    trial_id: int
    trial_dir: pathlib.Path
    latest_checkpoint: str | None = None
    continue_command: str = ""
    # fit()'s warm_start: True when the trial starts from another trial's checkpoint
    # (searcher.source_checkpoint_uuid / source_trial_id), None to let the checkpoint decide.
    warm_start: bool | None = None
    # The trial's recorded seed (None: derived from the experiment seed, see `trial_seed`).
    seed: int | None = None
    # A search's trial: the search it reports to, and the trial there (its seed).
    search: SearchConnection | None = None

    @property
    def checkpoint_dir(self) -> pathlib.Path:
        return self.trial_dir / "checkpoints"

    @property
    def log_file(self) -> pathlib.Path:
        return self.trial_dir / "trial.log"

    @property
    def run_file(self) -> pathlib.Path:
        return self.trial_dir / "run.json"

    @property
    def work_dir(self) -> pathlib.Path | None:
        """A search's trial runs in its own copy of the experiment folder (`_workdir`); a
        single trial (None) in the folder itself."""
        return self.trial_dir / WORKDIR if self.search is not None else None

    def working_dir(self, plan: Plan) -> pathlib.Path:
        """Where the trial's hook and entrypoint run and its code is imported from."""
        return self.work_dir if self.work_dir is not None else plan.context_dir


def trial_seed(plan: Plan, trial: TrialRun) -> int:
    """The trial's seed: a search's trial has its own; a single trial's derives from the
    experiment seed as a search's first trial's does (Determined draws every trial's seed from
    the experiment seed)."""
    if trial.seed is not None:
        return int(trial.seed)
    if trial.search is not None:
        return int(trial.search.trial.seed)
    return trial_draw(plan.config.space, plan.config.model.reproducibility.experiment_seed or 0, 0)[
        0
    ]


def prepare(
    config_path: str | os.PathLike[str],
    context_dir: Any,
    options: Options,
    config: ResolvedConfig | None = None,
) -> Plan:
    """Load and validate everything a run needs (`config`: the config at `config_path` with
    `options.overrides`, already loaded); raise InvalidArgumentError on bad input."""
    if config is None:
        config = load_config(config_path, options.overrides)
    if options.test_mode:
        config = config.first_configuration()  # a search's test: its first trial
    config.require_one_trial()
    config_file = pathlib.Path(config_path).resolve()
    folder = pathlib.Path(context_dir) if context_dir is not None else config_file.parent
    return prepare_config(config, folder, options)


def prepare_config(config: ResolvedConfig, folder: pathlib.Path, options: Options) -> Plan:
    """`prepare()` for a config already loaded (an experiment's recorded one)."""
    if not folder.is_dir():
        raise InvalidArgumentError(
            f"context directory {str(folder)!r} not found; pass the folder holding the trial "
            "code (the `.` of `det e create const.yaml .`)."
        )
    entrypoint = parse_entrypoint(config.model.entrypoint)
    plan = Plan(config, folder.resolve(), entrypoint, options)
    if entrypoint.trial is not None:
        if plan.config.length("max_length") is None:
            raise InvalidArgumentError(
                "searcher.max_length: required for a trial-class entrypoint (how long to "
                "train), e.g. searcher.max_length.epochs: 5, or --set "
                "searcher.max_length.batches=100"
            )
        # Checks records units (global_batch_size) before anything runs.
        plan.config.length("min_validation_period")
        plan.config.length("min_checkpoint_period")
    if plan.processes < 1:
        raise InvalidArgumentError(f"--devices: expected a positive integer, got {plan.processes}")
    return plan


def unused_warning(plan: Plan, launcher_keys: tuple[str, ...] = ()) -> str | None:
    """The one warning listing the config keys the run does not use (its launcher reads
    `launcher_keys`), and what Determined would have refused that the bridge runs."""
    unused = [k for k in plan.config.unused_keys if k.split(" ")[0] not in launcher_keys]
    lines = [
        f"Determined 0.38.1 would not run this config: {line}"
        for line in plan.config.determined_differences
    ]
    if unused:
        lines.insert(0, "experiment config keys not used by lightning-bridge: " + ", ".join(unused))
    if plan.config.starts_no_trial:
        lines.append(
            "hyperparameters: the grid searcher has no hyperparameter to search over, so its "
            "grid has no point and the experiment completes without a trial (as on "
            "Determined); add hyperparameters (a count on each range) or use the single searcher"
        )
    return "\n".join(lines) or None
