"""A workspace's own settings: `<workspace>/workspace.json`, a file the user edits.

    {"launcher": "slurm", "record": "postgresql://USER:PASSWORD@HOST/DATABASE"}

- `launcher`: where `run` starts trials when its command line names no `--launcher`
  (`local` when unset);
- `record`: the experiment record's database; unset, the record is `registry.sqlite` in the
  workspace. A record that trials on several machines write (the Slurm launcher across nodes)
  is a PostgreSQL server every node reaches, as a search's `--storage` is;
- `tracking_uri`: where the record is mirrored in MLflow (`tracking/_settings`: after
  `--tracking-uri` and `MLFLOW_TRACKING_URI`; `"off"` turns the mirror off).

Every key is optional; a file that is not a JSON object of these keys is refused with its
path and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from lightning_bridge._errors import InvalidArgumentError

SETTINGS_FILE = "workspace.json"
_KEYS = ("launcher", "record", "tracking_uri")
_EXAMPLE = '{"launcher": "slurm", "record": "postgresql://USER:PASSWORD@HOST/DATABASE"}'


@dataclasses.dataclass(frozen=True)
class WorkspaceSettings:
    """What `<workspace>/workspace.json` sets (None: not set)."""

    launcher: str | None = None
    record: str | None = None
    tracking_uri: str | None = None

    @classmethod
    def read(cls, root: pathlib.Path) -> WorkspaceSettings:
        path = root / SETTINGS_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(
                f"{path} is not a JSON object ({exc}); write it as {_EXAMPLE} (either key "
                "may be left out), or delete it."
            ) from None
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"{path}: expected a JSON object such as {_EXAMPLE}.")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise InvalidArgumentError(
                f"{path}: unknown setting {', '.join(map(repr, unknown))}; the settings are "
                f"{', '.join(_KEYS)}, e.g. {_EXAMPLE}."
            )
        for key in _KEYS:
            if data.get(key) is not None and not isinstance(data[key], str):
                raise InvalidArgumentError(f"{path}: {key} must be a string, e.g. {_EXAMPLE}.")
        record = data.get("record") or None
        if record is not None and record.split("://", 1)[0].split("+", 1)[0] not in (
            "postgresql",
            "postgres",
        ):
            raise InvalidArgumentError(
                f"{path}: record {record!r} is not a postgresql:// URL; the record is either "
                "the workspace's own registry.sqlite (leave record out) or a PostgreSQL "
                "server (postgresql://USER:PASSWORD@HOST/DATABASE)."
            )
        return cls(
            launcher=data.get("launcher") or None,
            record=record,
            tracking_uri=data.get("tracking_uri") or None,
        )
