"""Size bounds for experiment configs and the `load_data.json` files they end up in.

A YAML config can be tiny and still expand to gigabytes: an alias (`*a`) repeats a whole node,
and nested aliases multiply (a "billion laughs" config). The config is written into every
checkpoint's `load_data.json`, expanded. So its expanded size is measured before anything uses
it (shared nodes counted once per use, in time linear in the distinct nodes) and a config over
`MAX_CONFIG_BYTES` is refused, as is one that contains itself; `load_data.json` files are read
only up to `MAX_LOAD_DATA_BYTES`.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from lightning_bridge._errors import InvalidArgumentError, InvalidCheckpointError

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_LOAD_DATA_BYTES = 16 * 1024 * 1024


class _Recursive(Exception):
    pass


def expanded_size(value: Any) -> int:
    """About the bytes of `value` written as JSON with every shared node repeated."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list, tuple)):
            return len(str(node)) + 2
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Recursive
        active.add(key)
        if isinstance(node, dict):
            total = 2 + sum(size(k) + size(v) + 2 for k, v in node.items())
        else:
            total = 2 + sum(size(v) + 1 for v in node)
        active.discard(key)
        sizes[key] = total
        return total

    return size(value)


def check_expanded_size(value: Any, what: str, limit: int = MAX_CONFIG_BYTES) -> None:
    """Refuse a config that expands beyond `limit` bytes or contains itself."""
    try:
        size = expanded_size(value)
    except _Recursive:
        raise InvalidArgumentError(
            f"{what} refers to itself (a YAML alias inside the node it names), so it has no "
            "end; write the repeated part out or drop the alias."
        ) from None
    except RecursionError:
        raise InvalidArgumentError(f"{what} is nested too deeply to be a config.") from None
    if size > limit:
        raise InvalidArgumentError(
            f"{what} expands to about {size / 2**20:.0f} MB (YAML aliases repeat the nodes they "
            f"name), more than the {limit // 2**20} MB a config may take; it is copied into "
            "every checkpoint. Remove the repeated aliases, or keep large data in a file the "
            "trial reads."
        )


def read_load_data(path: pathlib.Path) -> dict[str, Any]:
    """A checkpoint's `load_data.json`, refused when too large or not a JSON object."""
    size = path.stat().st_size
    if size > MAX_LOAD_DATA_BYTES:
        raise InvalidCheckpointError(
            f"{path} is {size / 2**20:.0f} MB, more than a checkpoint's load_data.json takes "
            f"({MAX_LOAD_DATA_BYTES // 2**20} MB: an experiment config and its "
            "hyperparameters); it was not read."
        )
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidCheckpointError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidCheckpointError(f"{path} does not hold a JSON object.")
    return data
