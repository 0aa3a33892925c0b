"""Determined experiment configs: load the YAML, apply `--set` overrides, validate, resolve.

The YAML is parsed with PyYAML and checked with pydantic models of the keys the runner uses.
Every problem becomes one `InvalidArgumentError` whose lines name the key's path and what was
expected (`searcher.max_length.epochs: expected a positive integer, got -3`). Determined keys
the runner does not use are collected so the command can warn about them once; keys Determined
itself does not know are refused, as Determined refuses them.

The keys and their models are declared in `_config_schema`, the error lines worded in
`_config_errors`; this module reads, overrides, validates and resolves.
"""

from __future__ import annotations

import copy
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

import pydantic
import yaml
from pydantic import BaseModel

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._bounded import check_expanded_size
from lightning_bridge.contract._units import Batch, Epoch, TrainUnit
from lightning_bridge.experiment.config._config_errors import as_yaml, config_errors
from lightning_bridge.experiment.config._config_schema import (
    IGNORED_KEYS,
    KNOWN_KEYS,
    RETENTION_DEFAULTS,
    USED_KEYS,
    CheckpointStorage,
    ExperimentConfig,
)
from lightning_bridge.search import (
    REMOVED,
    SEARCHER_NAMES,
    SearchSpec,
    Space,
    grid_points,
    missing_counts,
    parse_space,
    trial_draw,
)
from lightning_bridge.search._searchers import UNITS


class ResolvedConfig:
    """A validated experiment config and the values a run takes from it.

    `space` is the hyperparameter space; `hparams` the one trial's values when the searcher is
    `single` (ranges sampled once, reproducibly from `reproducibility.experiment_seed`, as
    Determined's single searcher samples them); `search` what a search of several trials needs.
    `hparams` given: the values of one trial already drawn (a recorded trial, or one trial of a
    search), used as they are.
    """

    def __init__(
        self,
        raw: dict[str, Any],
        model: ExperimentConfig,
        space: Space,
        hparams: dict[str, Any] | None = None,
    ) -> None:
        self.raw = raw
        self.model = model
        self.space = space
        self._hparams: dict[str, Any] | None = hparams
        if hparams is None and not self.is_search:
            seed = model.reproducibility.experiment_seed or 0
            self._hparams = trial_draw(space, seed, 0)[1]

    def with_seed(self, seed: int) -> ResolvedConfig:
        """This config with `reproducibility.experiment_seed` set to `seed` (a config that
        named none, once the run drew one), without validating it again."""
        raw = apply_overrides(self.raw, [f"reproducibility.experiment_seed={seed}"])
        reproducibility = self.model.reproducibility.model_copy(update={"experiment_seed": seed})
        model = self.model.model_copy(update={"reproducibility": reproducibility})
        return ResolvedConfig(raw, model, self.space)

    @property
    def name(self) -> str:
        """The experiment's `name` ("" when it has none)."""
        return str(self.raw.get("name") or "")

    @property
    def description(self) -> str:
        """The experiment's `description` ("" when it has none)."""
        return str(self.raw.get("description") or "")

    @property
    def is_search(self) -> bool:
        """Whether the searcher runs several trials (everything but `single`)."""
        return self.model.searcher.name != "single"

    @property
    def starts_no_trial(self) -> bool:
        """A grid searcher over no hyperparameter range or value: its grid has no point, so
        the experiment completes without a trial (Determined accepts such a config)."""
        return self.model.searcher.name == "grid" and not grid_points(self.space)

    @property
    def search(self) -> SearchSpec:
        """The searcher, hyperparameters and seed a `SearchDriver` runs."""
        return SearchSpec(
            self.model.searcher,
            copy.deepcopy(self.raw.get("hyperparameters") or {}),
            self.model.reproducibility.experiment_seed,
        )

    def require_one_trial(self) -> None:
        """Refuse a searcher of several trials where one trial's values are needed (and were
        not given: a search's trial has them)."""
        if self.is_search and self._hparams is None:
            name = self.model.searcher.name
            raise InvalidArgumentError(
                f"searcher.name: the {name} searcher runs several trials, each with its own "
                "hyperparameters; run the search with `lightning-bridge run CONFIG`, or train "
                "one configuration with --set searcher.name=single (hyperparameter ranges are "
                "then sampled once from reproducibility.experiment_seed)"
            )

    def first_configuration(self) -> ResolvedConfig:
        """The search's first trial as a config of its own (the hyperparameters the searcher
        draws first, from `experiment_seed` or 0): what test mode trains, and what a search's
        entrypoint and lengths are checked with before it starts."""
        if not self.is_search:
            return self
        if self.model.searcher.name == "grid":
            # Determined takes the grid from its end; an empty grid's search starts no trial,
            # and test mode trains the trial with no hyperparameters.
            hparams = next(iter(grid_points(self.space)[-1:]), {})
        else:
            hparams = trial_draw(self.space, self.model.reproducibility.experiment_seed or 0, 0)[1]
        return ResolvedConfig(self.raw, self.model, self.space, hparams)

    @property
    def hparams(self) -> dict[str, Any]:
        """The one trial's hyperparameters (a single-trial config or a trial's drawn values;
        see `require_one_trial`)."""
        if self._hparams is None:
            self.require_one_trial()
        assert self._hparams is not None
        return self._hparams

    @property
    def unused_keys(self) -> list[str]:
        """Dotted paths of Determined keys given in the config that the runner ignores."""
        found = [k for k in self.raw if k in IGNORED_KEYS]
        searcher = self.model.searcher
        # A legacy flag, parsed and not used (as in Determined 0.38); source_trial_id /
        # source_checkpoint_uuid are used (the trial's warm start).
        for key in ("stop_once",):
            if getattr(searcher, key, None) is not None:
                found.append(f"searcher.{key}")
        sections: list[tuple[str, BaseModel | None]] = [
            ("searcher", self.model.searcher),
            ("resources", self.model.resources),
            ("optimizations", self.model.optimizations),
            ("reproducibility", self.model.reproducibility),
            ("profiling", self.model.profiling),
            ("environment", self.model.environment),
            ("checkpoint_storage", self.model.checkpoint_storage),
        ]
        for name, section in sections:
            if section is not None and section.model_extra:
                found.extend(f"{name}.{key}" for key in section.model_extra)
        storage = self.model.checkpoint_storage
        if storage is not None:
            found.extend(f"checkpoint_storage.{key}" for key in storage.unused())
        if "max_restarts" in self.raw and self.model.max_restarts > 0:
            found.append(
                "max_restarts (a failed trial is not restarted: continue it with "
                "`lightning-bridge experiment continue ID`)"
            )
        return sorted(found)

    @property
    def determined_differences(self) -> list[str]:
        """What Determined 0.38.1 says of the config where the bridge runs it and Determined
        would not: one line each, for the command to warn about once."""
        raw_searcher = self.raw.get("searcher")
        searcher = self.model.searcher
        lines = []
        if not raw_searcher:
            lines.append(
                "searcher: Determined requires a searcher section (searcher is a required "
                "property); lightning-bridge runs the single searcher"
            )
        elif searcher.metric is None:
            lines.append(
                "searcher.metric: Determined requires it for every searcher (metric is a "
                "required property); lightning-bridge trains without ranking validations"
            )
        name = searcher.name
        timed = searcher.max_time is not None
        if name in ("adaptive_asha", "async_halving") and not timed:
            lines.append(
                f"searcher: Determined 0.38 refuses the {name} searcher without max_time and "
                "time_metric (max_length is deprecated); lightning-bridge ranks trials at "
                "fractions of max_length"
            )
        if name in ("single", "random", "grid") and timed:
            lines.append(
                f"searcher.max_time, searcher.time_metric: the {name} searcher of Determined "
                "has no such keys (additional properties are not allowed); lightning-bridge "
                "takes them as the trial's length, Determined takes max_length or "
                "fit(max_length=...)"
            )
        if searcher.time_metric == "records":
            lines.append(
                "searcher.time_metric: records is not a metric Determined's harness reports "
                "(it adds batches and epochs to each validation); lightning-bridge counts "
                "records as batches x global_batch_size"
            )
        return lines

    def experiment_config(self, base: pathlib.Path | None = None) -> dict[str, Any]:
        """The config an experiment records and hands to the trial
        (`context.get_experiment_config()`): the searcher's defaults filled in, and
        `checkpoint_storage` with Determined's retention defaults (`save_trial_latest: 1`,
        `save_trial_best: 1`, `save_experiment_best: 0`) where the config has none; a relative
        `host_path` / `container_path` taken relative to `base` (the context directory)."""
        conf = copy.deepcopy(self.raw)
        section = dict(conf.get("checkpoint_storage") or {})
        for key, default in RETENTION_DEFAULTS.items():
            section.setdefault(key, default)
        for key in ("host_path", "container_path"):
            if section.get(key):
                path = pathlib.Path(os.path.expanduser(str(section[key])))
                if base is not None and not path.is_absolute():
                    path = base / path
                section[key] = str(path)
        conf["checkpoint_storage"] = section
        searcher = dict(conf.get("searcher") or {})
        searcher.setdefault("name", "single")
        searcher.setdefault("smaller_is_better", self.model.searcher.smaller_is_better)
        conf["searcher"] = searcher
        conf.setdefault("checkpoint_policy", self.model.checkpoint_policy)
        return conf

    def length(self, field: str) -> TrainUnit | None:
        """`max_length`, `min_validation_period` or `min_checkpoint_period` as a TrainUnit
        (None when not configured; a period of 0 means never, as in Determined)."""
        if field == "max_length":
            # The trial's length: `max_length` as Determined's harness reads it for a trial
            # class; else `max_time` when its `time_metric` is a unit of training (a metric
            # of the trial's own, such as `samples`, is the searcher's time only).
            searcher = self.model.searcher
            time = searcher.max_time, searcher.time_metric
            if searcher.max_length is None and time[0] is not None and time[1] in UNITS:
                return self._unit(time[1], time[0], "searcher.max_time")
            if isinstance(searcher.max_length, int):
                return None  # no unit: a script's fit(max_length=...) gives the length
            spec: BaseModel | None = searcher.max_length
            path = "searcher.max_length"
        else:
            spec = getattr(self.model, field)
            path = field
        if spec is None:
            return None
        for unit in ("batches", "records", "epochs"):
            value = getattr(spec, unit)
            if value is not None:
                if value == 0:
                    return Batch(sys.maxsize)
                return self._unit(unit, value, f"{path}.{unit}")
        return None

    def _unit(self, unit: str, value: int, path: str) -> TrainUnit:
        if unit == "epochs":
            return Epoch(value)
        if unit == "batches":
            return Batch(value)
        gbs = self.hparams.get("global_batch_size")
        if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1:
            raise InvalidArgumentError(
                f"{path}: a length in records needs the hyperparameter global_batch_size (a "
                "positive integer) to convert records into batches; add it or give the length "
                "in batches or epochs."
            )
        return Batch(max(value // gbs, 1))


def _check_searcher(searcher: Any, errors: list[str]) -> dict[str, Any] | Any:
    """Name the searcher (`single` when absent, as the runner always did); a removed or
    unknown name is one error, and the section is then checked as `single`."""
    if not isinstance(searcher, dict):
        return searcher
    searcher = dict(searcher)
    name = searcher.setdefault("name", "single")
    if name in SEARCHER_NAMES:
        return searcher
    if isinstance(name, str) and name in REMOVED:
        errors.append(f"searcher.name: {REMOVED[name]}")
    else:
        errors.append(
            f"searcher.name: expected one of {', '.join(SEARCHER_NAMES)}, got {as_yaml(name)}"
        )
    return {k: v for k, v in searcher.items() if k in ("metric", "smaller_is_better")}


def _check_space(raw: Any, model: ExperimentConfig | None, errors: list[str]) -> Space:
    """The hyperparameter space, every malformed form reported; the grid searcher's needs."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return {}
    space, problems = parse_space(raw)
    for where, problem in problems:
        if isinstance(problem, str):
            errors.append(f"{'.'.join(where)}: {problem}")
        else:
            errors.extend(config_errors(problem, where, hparam=True))
    if model is not None and model.searcher.name == "grid" and not problems:
        for path in missing_counts(space):
            key = ".".join(("hyperparameters", *path))
            errors.append(
                f"{key}: the grid searcher needs count, the number of points of this range "
                f"to try (e.g. --set {key}.count=4)"
            )
    return space


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides (values parsed as YAML) to a copy of the config."""
    conf = copy.deepcopy(config)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(
                f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set hyperparameters.lr=0.01"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise InvalidArgumentError(
                f"--set {item!r}: the value is not valid YAML: {exc}"
            ) from None
        parts = key.strip().split(".")
        node: Any = conf
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise InvalidArgumentError(
                    f"--set {item!r}: {where} is {as_yaml(child)}, not a mapping, so it has "
                    f"no key {parts[depth + 1]!r}"
                )
            node = child
        node[parts[-1]] = value
    return conf


def parse_config(config: Any, overrides: list[str] | None = None) -> ResolvedConfig:
    """Validate an experiment config (a dict, after `overrides`) and resolve its values."""
    if config is None:
        config = {}
    check_expanded_size(config, "the experiment config")
    if not isinstance(config, dict):
        raise InvalidArgumentError(
            f"the experiment config must be a mapping of keys to values; got {as_yaml(config)}"
        )
    raw = apply_overrides(config, overrides or [])
    errors: list[str] = []
    unknown = sorted(str(k) for k in raw if k not in KNOWN_KEYS)
    errors.extend(
        f"{key}: unknown key (Determined's experiment config has no such key; check its spelling)"
        for key in unknown
    )
    # Empty sections (`searcher:` with nothing under it) read as absent, as in Determined.
    known = {k: v for k, v in raw.items() if k in USED_KEYS and v is not None}
    if "searcher" in known:
        known["searcher"] = _check_searcher(known["searcher"], errors)
    model: ExperimentConfig | None = None
    try:
        model = ExperimentConfig.model_validate(known)
    except pydantic.ValidationError as exc:
        errors.extend(config_errors(exc))
    space = _check_space(known.get("hyperparameters"), model, errors)
    if errors or model is None:
        raise InvalidArgumentError(
            "invalid experiment config:\n" + "\n".join(f"  {line}" for line in errors)
        )
    return ResolvedConfig(raw, model, space)


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> ResolvedConfig:
    """Read an experiment config YAML file and validate it (see `parse_config`)."""
    file = pathlib.Path(path)
    if not file.is_file():
        raise InvalidArgumentError(
            f"experiment config {str(file)!r} not found; pass the path of the const.yaml "
            "you give to `det e create`."
        )
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"{file} is not valid YAML: {exc}") from None
    return parse_config(data, overrides)


def recorded_storage(config: Mapping[str, Any]) -> CheckpointStorage:
    """The `checkpoint_storage` section of a config an experiment recorded
    (`ResolvedConfig.experiment_config`, validated when the experiment started), typed: its
    storage keys and retention counts (Determined's defaults where it has none)."""
    return CheckpointStorage.model_validate(config.get("checkpoint_storage") or {})
