"""`checkpoint_storage` as Determined's experiment config spells it, turned into a storage.

| type | keys | file system |
| --- | --- | --- |
| (none) | | the trial's own `checkpoints/` folder |
| `shared_fs` | `host_path`, `storage_path` | local folder `host_path/storage_path` |
| `directory` | `container_path` | local folder |
| `s3` | `bucket`, `prefix`, `access_key`, `secret_key`, `endpoint_url` | s3fs (extra `s3`) |
| `gcs` | `bucket`, `prefix` | gcsfs (extra `gcs`) |
| `azure` | `container`, `connection_string` or `account_url` + `credential` | adlfs (`azure`) |

Missing credentials fall back to each back end's usual sources (environment variables, config
files, instance metadata), as Determined's do.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import urllib.parse
from collections.abc import Mapping
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.checkpoint._storage_backend import CheckpointStorage

STORAGE_TYPES = ("shared_fs", "directory", "s3", "gcs", "azure")
# type -> (the fsspec back end's module, the lightning-bridge extra that installs it)
_BACKENDS = {"s3": ("s3fs", "s3"), "gcs": ("gcsfs", "gcs"), "azure": ("adlfs", "azure")}


def check_backend(kind: str) -> None:
    """Fail early, naming the extra, when the back end of a storage type is not installed."""
    if kind not in _BACKENDS:
        return
    module, extra = _BACKENDS[kind]
    if importlib.util.find_spec(module) is None:
        raise InvalidArgumentError(
            f"checkpoint_storage.type {kind} needs the {module} package: "
            f"pip install 'lightning-bridge[{extra}]'"
        )


def _prefix(value: Any) -> str:
    return str(value or "").strip("/")


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _resolved(root: pathlib.Path) -> str:
    """`root` resolved; as given (absolute) when it cannot be, e.g. a symbolic link loop,
    which the storage's probe then reports."""
    try:
        return str(root.resolve())
    except (OSError, RuntimeError):
        return str(root.absolute())


def storage_from_config(
    section: Mapping[str, Any] | None, default_root: pathlib.Path
) -> CheckpointStorage:
    """The storage a `checkpoint_storage` section names (`default_root` when there is none)."""
    import fsspec

    kind = (section or {}).get("type") or "shared_fs"
    if not section or (kind == "shared_fs" and not section.get("host_path")):
        # No storage named (or only its retention keys): the trial's own folder.
        return CheckpointStorage("default", fsspec.filesystem("file"), str(default_root))
    if kind == "shared_fs":
        host = pathlib.Path(os.path.expanduser(str(section["host_path"])))
        root = host / str(section.get("storage_path") or "")
        return CheckpointStorage(kind, fsspec.filesystem("file"), _resolved(root))
    if kind == "directory":
        root = pathlib.Path(os.path.expanduser(str(section["container_path"])))
        return CheckpointStorage(kind, fsspec.filesystem("file"), _resolved(root))
    if kind not in _BACKENDS:
        raise InvalidArgumentError(
            f"checkpoint_storage.type: expected one of {', '.join(STORAGE_TYPES)}, got {kind!r}"
        )
    check_backend(kind)
    if kind == "s3":
        client: dict[str, Any] = {}
        if section.get("endpoint_url"):
            client["endpoint_url"] = section["endpoint_url"]
        fs = fsspec.filesystem(
            "s3",
            key=section.get("access_key"),
            secret=section.get("secret_key"),
            client_kwargs=client,
            skip_instance_cache=True,
        )
        bucket = _join(str(section["bucket"]), _prefix(section.get("prefix")))
        return CheckpointStorage(kind, fs, bucket, scheme="s3://")
    if kind == "gcs":
        fs = fsspec.filesystem("gcs", skip_instance_cache=True)
        bucket = _join(str(section["bucket"]), _prefix(section.get("prefix")))
        return CheckpointStorage(kind, fs, bucket, scheme="gs://")
    return _azure(section)


def _azure(section: Mapping[str, Any]) -> CheckpointStorage:
    import fsspec

    options: dict[str, Any] = {"skip_instance_cache": True}
    if section.get("connection_string"):
        options["connection_string"] = section["connection_string"]
    else:
        host = urllib.parse.urlparse(str(section["account_url"])).netloc
        options["account_name"] = host.split(".", 1)[0]
        options["account_host"] = host
        if section.get("credential"):
            options["credential"] = section["credential"]
    fs = fsspec.filesystem("abfs", **options)
    return CheckpointStorage("azure", fs, str(section["container"]).strip("/"), scheme="az://")
