"""`RunDescription`: what the runner tells a trial's process, typed and versioned.

`lightning-bridge run` (and a search's worker) writes one JSON file per trial and names it in
`LIGHTNING_BRIDGE_EXPERIMENT`; every process of the trial (a trial class trained in the
command's own process, a script it launched, the ranks torchrun or Lightning's launcher start,
a search's `_trial` subprocess) reads it once, through `RunDescription.current()`, and passes
it on typed: `init()` takes its values where the caller left the default, `Trainer.fit` its
length, resume and record, `get_cluster_info()` its ids. It is complete, so a launcher that
starts the trial elsewhere hands over this file alone: the trial's ids and folders, the
config, hyperparameters and seed, the engine settings, the fit's schedule and where it
continues from, and the connections to the experiment record and the search.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._private import write_file
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.translation._engine_settings import EngineSettings

if TYPE_CHECKING:  # the search package (pydantic) is loaded only for a search's trial
    from lightning_bridge.search import TrialSpec

ENV_VAR = "LIGHTNING_BRIDGE_EXPERIMENT"
# The layout of the file; a reader refuses another (a trial started by another version).
VERSION = 1


@dataclasses.dataclass(frozen=True)
class RecordConnection:
    """Where the trial is recorded: the workspace's registry and the trial's ids there."""

    workspace: str
    experiment_id: int
    trial_id: int


@dataclasses.dataclass(frozen=True)
class SearchConnection:
    """The search the trial reports to: its Optuna storage, its name, the searcher metric,
    and the trial as the worker pulled it."""

    storage: str
    name: str
    metric: str
    trial: TrialSpec

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchConnection:
        from lightning_bridge.search import TrialSpec

        trial = dict(data["trial"])
        trial["rungs"] = tuple(trial.get("rungs") or ())
        return cls(str(data["storage"]), str(data["name"]), str(data["metric"]), TrialSpec(**trial))


def _unit_json(unit: TrainUnit | None) -> list[Any] | None:
    if unit is None:
        return None
    return ["epochs" if isinstance(unit, Epoch) else "batches", unit.value]


def _unit(data: Any) -> TrainUnit | None:
    if not data:
        return None
    kind, value = data
    return Epoch(int(value)) if kind == "epochs" else Batch(int(value))


def _path(value: Any) -> pathlib.Path | None:
    return None if value is None else pathlib.Path(value)


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """One trial's run as its processes get it (see the module docstring). A folder left None
    is the process's default (the working directory's)."""

    # The trial: where it is recorded (None: not recorded), its folders, what it runs.
    record: RecordConnection | None = None
    run_dir: pathlib.Path | None = None
    checkpoint_dir: pathlib.Path | None = None
    log_file: pathlib.Path | None = None
    context_dir: pathlib.Path | None = None
    entrypoint: str | list[str] | None = None
    # The experiment config as the trial gets it (`context.get_experiment_config()`), the
    # config as written (with the command's overrides), the trial's hyperparameters and seed.
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    raw_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    trial_seed: int = 0
    # The engine and the gradient aggregation.
    engine: EngineSettings = dataclasses.field(default_factory=EngineSettings)
    aggregation_frequency: int = 1
    # The fit: its length and periods (a script's fit takes max_length when it gives none),
    # where it continues from, and the run command's flags.
    max_length: TrainUnit | None = None
    validation_period: TrainUnit | None = None
    checkpoint_period: TrainUnit | None = None
    reporting_period: int = 100
    checkpoint_policy: str = "best"
    step_zero_validation: bool = False
    profiling_enabled: bool = False
    test_mode: bool = False
    trust_checkpoint: bool = False
    latest_checkpoint: str | None = None
    warm_start: bool | None = None
    # The command that continues the trial after a stop, and how many times a launcher that
    # restarts a failed trial restarts it (the config's `max_restarts`; None in a run file
    # written before this field, whose `raw_config` then says).
    continue_command: str = ""
    max_restarts: int | None = None
    # The search the trial reports to (None: not a search's trial).
    search: SearchConnection | None = None
    # The run command's options, which a `_trial` process plans the run with again.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = VERSION

    @property
    def trial_id(self) -> int:
        return self.record.trial_id if self.record is not None else 1

    @property
    def experiment_id(self) -> int:
        return self.record.experiment_id if self.record is not None else 1

    def fit_defaults(
        self,
        max_length: TrainUnit | None,
        test_mode: bool,
        trust_checkpoint: bool,
        warm_start: bool | None,
    ) -> tuple[TrainUnit | None, bool, bool, bool | None]:
        """`fit()`'s arguments with the run's filled in: `max_length` (the config's searcher
        length when the caller gives none), `test_mode` (`--test`), `trust_checkpoint`
        (`--trust-checkpoint`) and `warm_start` (on when the run starts from
        `searcher.source_checkpoint_uuid` / `source_trial_id`, not a checkpoint of its own)."""
        if max_length is None:
            max_length = self.max_length
        if warm_start is None and self.warm_start:
            warm_start = True
        return (
            max_length,
            True if self.test_mode else test_mode,
            True if self.trust_checkpoint else trust_checkpoint,
            warm_start,
        )

    # ----- JSON -----

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, pathlib.Path):
                value = str(value)
            elif isinstance(value, TrainUnit):
                value = _unit_json(value)
            elif isinstance(value, (EngineSettings, SearchConnection)):
                value = value.to_json()
            elif isinstance(value, RecordConnection):
                value = dataclasses.asdict(value)
            data[field.name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDescription:
        """The description a JSON object holds; KeyError / TypeError / ValueError when it is
        not one (see `read`)."""
        version = data.get("version")
        if version != VERSION:
            raise ValueError(f"layout version {version!r}; this lightning-bridge reads {VERSION}")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        record, search = values.pop("record", None), values.pop("search", None)
        engine = values.pop("engine", None) or {}
        for name in ("run_dir", "checkpoint_dir", "log_file", "context_dir"):
            values[name] = _path(values.get(name))
        for name in ("max_length", "validation_period", "checkpoint_period"):
            values[name] = _unit(values.get(name))
        return cls(
            **values,
            record=RecordConnection(**record) if record else None,
            search=SearchConnection.from_json(search) if search else None,
            engine=EngineSettings.from_json(engine),
        )

    def write(self, path: pathlib.Path) -> None:
        """Write the description to `path` whole (a reader never sees half of it); an
        unchanged file is left alone. It holds the config, secrets included: created private
        (`_private`)."""
        text = json.dumps(self.to_json(), indent=1, default=str)
        if path.is_file() and path.read_text() == text:
            return
        write_file(path, text)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunDescription:
        """The description in the file at `path`; InvalidArgumentError when it is not one."""
        file = pathlib.Path(path)
        try:
            stat = file.stat()
        except OSError as exc:
            raise InvalidArgumentError(
                f"{file}: not a trial's run description ({exc.strerror})"
            ) from None
        return _read(str(file), stat.st_mtime_ns, stat.st_size)

    @classmethod
    def current(cls) -> RunDescription | None:
        """The description of this process's trial (named in `LIGHTNING_BRIDGE_EXPERIMENT`),
        or None when no runner started it."""
        path = os.environ.get(ENV_VAR)
        return cls.read(path) if path else None


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime_ns: int, size: int) -> RunDescription:
    """Read and parse once per version of the file."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        return RunDescription.from_json(data)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{path}: not a trial's run description ({exc})") from None
