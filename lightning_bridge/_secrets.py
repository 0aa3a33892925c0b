"""What the bridge treats as a secret, and how a config is shown without its secrets.

One definition: the checkpoint storage's keys and credentials (`access_key`, `secret_key`,
`credential`, `connection_string`), a URL's password, and the values of the config's
`environment.environment_variables` whose names mark them secret: a name containing TOKEN,
KEY, SECRET, PASSWORD or CREDENTIAL (any case), or one the user lists in
`LIGHTNING_BRIDGE_SECRET_NAMES` (comma-separated shell patterns, e.g. `WANDB_*,MY_DSN`).
Shown, each secret value is `***`.
"""

from __future__ import annotations

import copy
import fnmatch
import os
import urllib.parse
from typing import Any

import yaml

MASK = "***"
STORAGE_SECRET_KEYS = ("access_key", "secret_key", "credential", "connection_string")
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
# More names to treat as secret: comma-separated shell patterns (fnmatch, any case).
EXTRA_NAMES_ENV = "LIGHTNING_BRIDGE_SECRET_NAMES"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's value is a secret, by its name."""
    upper = name.upper()
    if any(part in upper for part in SECRET_NAME_PARTS):
        return True
    extra = [p.strip().upper() for p in os.environ.get(EXTRA_NAMES_ENV, "").split(",")]
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in extra if pattern)


def redact_variable(entry: Any) -> Any:
    """A `NAME=VALUE` entry as shown: its value masked where its name is secret."""
    if not isinstance(entry, str) or "=" not in entry:
        return entry
    name, _, value = entry.partition("=")
    return f"{name}={MASK}" if value and is_secret_name(name) else entry


def redact_url(url: str) -> str:
    """A URL as shown: its password masked (`postgresql://user:***@host/db`)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if not parts.password:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{netloc[1]}"))


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of an experiment config with every secret value masked (the storage's keys,
    the secret environment variables in both of Determined's forms)."""
    shown = copy.deepcopy(config)
    storage = shown.get("checkpoint_storage")
    if isinstance(storage, dict):
        for key in STORAGE_SECRET_KEYS:
            if storage.get(key):
                storage[key] = MASK
    environment = shown.get("environment")
    if not isinstance(environment, dict):
        return shown
    variables = environment.get("environment_variables")
    if isinstance(variables, list):
        environment["environment_variables"] = [redact_variable(e) for e in variables]
    elif isinstance(variables, dict):
        environment["environment_variables"] = {
            kind: [redact_variable(e) for e in entries] if isinstance(entries, list) else entries
            for kind, entries in variables.items()
        }
    return shown


def _variable_entries(config: dict[str, Any]) -> list[Any]:
    environment = config.get("environment")
    if not isinstance(environment, dict):
        return []
    variables = environment.get("environment_variables")
    if isinstance(variables, list):
        return variables
    if isinstance(variables, dict):
        return [e for entries in variables.values() if isinstance(entries, list) for e in entries]
    return []


def secret_values(config: dict[str, Any]) -> list[str]:
    """The secret values an experiment config holds (what `redact_config` masks), longest
    first so that masking one never leaves part of another."""
    found: set[str] = set()
    storage = config.get("checkpoint_storage")
    if isinstance(storage, dict):
        for key in STORAGE_SECRET_KEYS:
            value = storage.get(key)
            if isinstance(value, str) and value:
                found.add(value)
    for entry in _variable_entries(config):
        if isinstance(entry, str) and "=" in entry:
            name, _, value = entry.partition("=")
            if value and is_secret_name(name):
                found.add(value)
    return sorted(found, key=lambda v: (-len(v), v))


def redact_text(text: str, values: list[str]) -> str:
    """`text` with each of `values` (secrets) masked."""
    for value in values:
        text = text.replace(value, MASK)
    return text


def redact_config_file(data: bytes, values: list[str]) -> bytes:
    """A copy of a file as it may be shared (a checkpoint's `code/`): unchanged unless it
    holds one of `values`; a YAML config is then written again from `redact_config` (still a
    valid config, `'***'` quoted), and any other file has each value masked."""
    needles = [v.encode() for v in values]
    if not any(n in data for n in needles):
        return data
    try:
        loaded = yaml.safe_load(data)
    except yaml.YAMLError:  # not YAML: masked as text below
        loaded = None
    if isinstance(loaded, dict):
        data = yaml.safe_dump(redact_config(loaded), sort_keys=False).encode()
    for needle in needles:
        data = data.replace(needle, MASK.encode())
    return data
