"""The experiment config's schema: which keys the runner uses, and pydantic models of them.

Determined's top-level keys sorted by what the runner does with each (used, descriptive,
ignored) and the models that check the sections the runner reads (strict types, Determined's
bounds). The `searcher` section and the hyperparameter forms are the search layer's
(`lightning_bridge.search`). Only declarations: loading a config, `--set` overrides and
turning validation errors into messages are in `_config`.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from lightning_bridge.search._searchers import OneUnit, SearcherConfig, SingleSearcher

# Every top-level key of Determined's experiment config (expconf v0), by what the runner does
# with it. docs/config.md has the same table with the reasons.
USED_KEYS = frozenset(
    {
        "checkpoint_policy",
        "checkpoint_storage",
        "data",
        "entrypoint",
        "environment",
        "hyperparameters",
        "max_restarts",
        "min_checkpoint_period",
        "min_validation_period",
        "optimizations",
        "perform_initial_validation",
        "preemption_timeout",
        "profiling",
        "records_per_epoch",
        "reproducibility",
        "resources",
        "scheduling_unit",
        "searcher",
    }
)
# Accepted without a warning: they describe the experiment, not how it trains.
DESCRIPTIVE_KEYS = frozenset({"name", "description", "labels", "project", "workspace"})
IGNORED_KEYS = frozenset(
    {
        "bind_mounts",
        "data_layer",
        "debug",
        "integrations",
        "internal",
        "log_policies",
        "pbs",
        "ray",
        "retention_policy",
        "security",
        "slurm",
        "tensorboard_storage",
    }
)
KNOWN_KEYS = USED_KEYS | DESCRIPTIVE_KEYS | IGNORED_KEYS


class _Model(BaseModel):
    """Strict about the keys it names; other keys are kept and reported as unused."""

    model_config = ConfigDict(extra="allow", strict=True)


class Period(OneUnit):
    """A minimum period: one of batches / records / epochs, N >= 0 (0: never)."""

    batches: Annotated[StrictInt, Field(ge=0)] | None = None
    records: Annotated[StrictInt, Field(ge=0)] | None = None
    epochs: Annotated[StrictInt, Field(ge=0)] | None = None


class Resources(_Model):
    slots_per_trial: Annotated[StrictInt, Field(ge=1)] = 1


class Optimizations(_Model):
    aggregation_frequency: Annotated[StrictInt, Field(ge=1)] = 1


class Reproducibility(_Model):
    experiment_seed: Annotated[StrictInt, Field(ge=0)] | None = None


class Profiling(_Model):
    enabled: StrictBool = False


# The keys each checkpoint_storage type reads (Determined's); the others are reported unused.
STORAGE_KEYS = {
    "shared_fs": ("host_path", "storage_path"),
    "directory": ("container_path",),
    "s3": ("bucket", "prefix", "access_key", "secret_key", "endpoint_url"),
    "gcs": ("bucket", "prefix"),
    "azure": ("container", "connection_string", "account_url", "credential"),
}
RETENTION_DEFAULTS = {"save_experiment_best": 0, "save_trial_best": 1, "save_trial_latest": 1}


# A `..` part of an object store prefix (Determined refuses it: the checkpoints would land
# outside the prefix).
_PARENT = re.compile(r"(^|/)\.\.(/|$)")


def _inside(path: str, parent: str) -> bool:
    """A relative path not climbing out, or an absolute one under `parent` (Determined's
    check of storage_path against host_path)."""
    path = posixpath.normpath(path)
    if posixpath.isabs(path):
        return path.startswith(posixpath.normpath(parent))
    return not path.startswith("..")


class CheckpointStorage(_Model):
    """Determined's storage types with their keys; retention counts as Determined's defaults.
    Without `type` (or `host_path` for shared_fs) checkpoints stay in the trial's folder."""

    type: Literal["shared_fs", "directory", "s3", "gcs", "azure"] | None = None
    host_path: StrictStr | None = None
    storage_path: StrictStr | None = None
    container_path: StrictStr | None = None
    bucket: StrictStr | None = None
    prefix: StrictStr | None = None
    access_key: StrictStr | None = None
    secret_key: StrictStr | None = None
    endpoint_url: StrictStr | None = None
    container: StrictStr | None = None
    connection_string: StrictStr | None = None
    account_url: StrictStr | None = None
    credential: StrictStr | None = None
    save_experiment_best: Annotated[StrictInt, Field(ge=0)] = 0
    save_trial_best: Annotated[StrictInt, Field(ge=0)] = 1
    save_trial_latest: Annotated[StrictInt, Field(ge=0)] = 1

    @pydantic.model_validator(mode="after")
    def _required(self) -> CheckpointStorage:
        needed = {
            "shared_fs": ("host_path",),
            "directory": ("container_path",),
            "s3": ("bucket",),
            "gcs": ("bucket",),
            "azure": ("container",),
        }
        if self.type is None:
            return self
        missing = [key for key in needed[self.type] if getattr(self, key) is None]
        if missing:
            raise ValueError(f"type {self.type} needs {', '.join(missing)}")
        if self.type == "azure":
            if (self.connection_string is None) == (self.account_url is None):
                raise ValueError(
                    "type azure needs exactly one of connection_string or account_url "
                    "(+ credential)"
                )
            if self.connection_string is not None and self.credential is not None:
                raise ValueError("credential and connection_string must not both be set")
        if self.type in ("s3", "gcs") and self.prefix is not None:
            if _PARENT.search(self.prefix):
                raise ValueError(f"prefix cannot contain /../, got {self.prefix!r}")
        if self.type == "shared_fs" and self.storage_path is not None:
            inside = _inside(self.storage_path, self.host_path or "")
            if not inside:
                raise ValueError(
                    "storage_path must either be a relative directory or a subdirectory of "
                    f"host_path, got {self.storage_path!r}"
                )
        return self

    def unused(self) -> list[str]:
        """Keys given that this type does not read."""
        reads = STORAGE_KEYS[self.type or "shared_fs"]
        every = {key for keys in STORAGE_KEYS.values() for key in keys}
        return sorted(k for k in every - set(reads) if getattr(self, k) is not None)


# Device types an `environment_variables` mapping names (Determined's; `gpu` is its older
# spelling of `cuda`).
DEVICE_TYPES = ("cpu", "cuda", "rocm")
# Variables each trial process gets from its launcher (its place among the trial's processes,
# the rendezvous) or from the bridge itself: a config cannot set them.
LAUNCHER_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
_BRIDGE_PREFIX = "LIGHTNING_BRIDGE_"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _kind(value: Any) -> str:
    """What a wrong value is, in the config's words (never the value itself)."""
    name = type(value).__name__
    return _KINDS.get(name, {"dict": "a mapping", "list": "a list"}.get(name, name))


def _no_variables() -> dict[str, list[str]]:
    return {kind: [] for kind in DEVICE_TYPES}


def _variable(entry: Any, where: str) -> str:
    """One `NAME=VALUE` entry, checked: a string, a name before the first `=`, a name the
    launcher does not own. Messages name the entry's place, never its text (a value may be a
    secret, and an entry without `=` may be one mistyped)."""
    if not isinstance(entry, str):
        raise ValueError(f"{where}: expected a string NAME=VALUE, got {_kind(entry)}")
    name, sep, _ = entry.partition("=")
    if not sep or not _NAME.fullmatch(name):
        raise ValueError(
            f"{where}: expected NAME=VALUE (a variable name, then '=' and its value); the "
            "entry has " + ("no '='" if not sep else "no valid name before its '='")
        )
    if name in LAUNCHER_VARIABLES or name.startswith(_BRIDGE_PREFIX):
        raise ValueError(
            f"{where}: {name} is set by the launcher for each of the trial's processes; "
            "remove it from environment_variables"
        )
    return entry


class Environment(_Model):
    """Determined's `environment` section. The runner applies `environment_variables` to
    every process of the trial (`variables_for`); images, pod specs and the other keys are
    reported unused (the run uses this machine's Python environment).

    `environment_variables` is a list of `NAME=VALUE` for every device type, or a mapping of
    `cpu` / `cuda` / `rocm` (`gpu`: `cuda`) to such lists, held here as the mapping."""

    environment_variables: dict[str, list[str]] = Field(default_factory=lambda: _no_variables())

    @pydantic.field_validator("environment_variables", mode="before")
    @classmethod
    def _by_device(cls, value: Any) -> dict[str, list[str]]:
        if value is None:
            return _no_variables()
        if isinstance(value, list):
            entries = [_variable(e, f"[{i}]") for i, e in enumerate(value)]
            return {kind: list(entries) for kind in DEVICE_TYPES}
        if not isinstance(value, dict):
            raise ValueError(
                "expected a list of NAME=VALUE strings, or a mapping of cpu, cuda or rocm to "
                f"such lists, got {_kind(value)}"
            )
        unknown = sorted(str(k) for k in value if k not in (*DEVICE_TYPES, "gpu"))
        if unknown:
            raise ValueError(f"unknown device type {unknown[0]!r}: expected cpu, cuda or rocm")
        out: dict[str, list[str]] = {}
        for kind in DEVICE_TYPES:
            key = "gpu" if kind == "cuda" and value.get("cuda") is None else kind
            entries = value.get(key) or []
            if not isinstance(entries, list):
                raise ValueError(
                    f"{key}: expected a list of NAME=VALUE strings, got {_kind(entries)}"
                )
            out[kind] = [_variable(e, f"{key}[{i}]") for i, e in enumerate(entries)]
        return out

    def variables_for(self, device_type: str) -> dict[str, str]:
        """The variables a trial on `device_type` (cpu, cuda, rocm) gets, in order: a name
        given twice takes its later value, as in Determined."""
        out: dict[str, str] = {}
        for entry in self.environment_variables[device_type]:
            name, _, value = entry.partition("=")
            out[name] = value
        return out


class SlurmSection(_Model):
    """Determined's `slurm` section (its keys and types): read by the Slurm launcher, which
    validates it (`slurm_section`); other launchers report it unused. `max_restarts` is the
    config's top-level key (`ExperimentConfig`)."""

    sbatch_args: list[StrictStr] | None = None
    slots_per_node: Annotated[StrictInt, Field(ge=1)] | None = None
    gpu_type: StrictStr | None = None


# The one line a bad `slurm` key gets (the key: its message; `{value}`: what was given).
SLURM_MESSAGES = {
    "": "slurm: expected a mapping (sbatch_args, slots_per_node)",
    "sbatch_args": 'slurm.sbatch_args: expected a list of strings, e.g. ["--time=01:00:00"]',
    "slots_per_node": "slurm.slots_per_node: expected a positive integer, got {value!r}",
    "gpu_type": "slurm.gpu_type: expected a string (the GPU type of --gres), got {value!r}",
}


class ExperimentConfig(BaseModel):
    """The keys the runner uses; the rest of the config is kept as given."""

    model_config = ConfigDict(extra="allow", strict=True)

    entrypoint: StrictStr | list[StrictStr] | None = None
    hyperparameters: dict[StrictStr, Any] = Field(default_factory=dict)
    searcher: Annotated[SearcherConfig, Field(discriminator="name")] = Field(
        default_factory=SingleSearcher
    )
    records_per_epoch: Annotated[StrictInt, Field(ge=0)] | None = None
    min_validation_period: Period | None = None
    min_checkpoint_period: Period | None = None
    scheduling_unit: Annotated[StrictInt, Field(ge=1)] = 100
    perform_initial_validation: StrictBool = False
    # Seconds a script entrypoint gets to checkpoint and exit after a stop signal.
    preemption_timeout: Annotated[StrictInt, Field(gt=0)] | None = None
    optimizations: Optimizations = Field(default_factory=Optimizations)
    resources: Resources = Field(default_factory=Resources)
    checkpoint_storage: CheckpointStorage | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    data: dict[StrictStr, Any] | None = None
    max_restarts: Annotated[StrictInt, Field(ge=0)] = 5
    reproducibility: Reproducibility = Field(default_factory=Reproducibility)
    profiling: Profiling = Field(default_factory=Profiling)
    environment: Environment = Field(default_factory=Environment)


class RaySection(BaseModel):
    """The config's `ray` section: what the Ray launcher needs that Determined's config never
    said (read and validated by that launcher, `launch/ray`; other launchers report it
    unused). Unknown keys are refused: the section is the bridge's own."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Processes of the trial on each node (a trial with more slots spans nodes); default: all
    # on one node.
    slots_per_node: Annotated[StrictInt, Field(ge=1)] | None = None
    # CPUs each process reserves (besides its GPU where the cluster has GPUs).
    cpus_per_slot: Annotated[StrictInt | StrictFloat, Field(gt=0)] = 1
    # Ray's runtime environment of the trial's actors and processes (env_vars, pip, ...).
    runtime_env: dict[str, Any] | None = None
    # The Ray namespace the trial's actors are named in.
    namespace: StrictStr = "lightning-bridge"


# The one line a bad `ray` key gets (the key: its message; `{value}`: what was given).
RAY_MESSAGES = {
    "": "ray: expected a mapping (slots_per_node, cpus_per_slot, runtime_env, namespace)",
    "slots_per_node": "ray.slots_per_node: expected a positive integer, got {value!r}",
    "cpus_per_slot": "ray.cpus_per_slot: expected a positive number of CPUs, got {value!r}",
    "runtime_env": (
        "ray.runtime_env: expected a mapping, Ray's runtime environment (env_vars, pip, "
        "py_modules, ...), got {value!r}"
    ),
    "namespace": "ray.namespace: expected a string, got {value!r}",
}
