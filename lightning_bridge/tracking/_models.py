"""`lightning-bridge model`: MLflow's model registry in Determined's habits.

`create`, `register-version` (a checkpoint of the record by its uuid: the version's source is
where the checkpoint is stored, referenced or logged by its trial's run; or a checkpoint folder
or storage URI the bridge did not write, such as a Determined checkpoint copied from a
cluster's storage, checked with the safe loader first), `list`, `list-versions`, `describe`,
aliases, and the way back: `download("models:/NAME/VERSION" | "models:/NAME@ALIAS", DIR)`.
"""

from __future__ import annotations

import pathlib
import re
import tempfile
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.record._registry import Registry
from lightning_bridge.tracking._mirror import TAG, Mirror, _remote, bounded_requests

IMPORTED_EXPERIMENT = "lightning-bridge imported checkpoints"
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))/?$")


class ModelRegistry:
    """MLflow's model registry at `uri`, for the checkpoints of one workspace."""

    def __init__(self, registry: Registry, uri: str) -> None:
        bounded_requests(retries=3, timeout_s=30)
        self.mirror = Mirror(registry, uri)
        self.client = self.mirror.client
        self.registry = registry

    def _model(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
                raise InvalidArgumentError(
                    f"model {name!r} is not in the registry at {self.mirror.uri}; create it with "
                    f"`lightning-bridge model create {name}` (`model list` shows the models)."
                ) from None
            raise

    def create(self, name: str, description: str = "") -> dict[str, Any]:
        from mlflow.exceptions import MlflowException

        try:
            model = self.client.create_registered_model(name, description=description or None)
        except MlflowException as exc:
            if "already exists" in str(exc).lower():
                raise InvalidArgumentError(
                    f"model {name!r} already exists; `lightning-bridge model describe {name}` "
                    "shows it."
                ) from None
            raise
        return model_json(model, [])

    def register(
        self, name: str, checkpoint: str, aliases: list[str], description: str = ""
    ) -> dict[str, Any]:
        self._model(name)
        found = self.registry.checkpoint(checkpoint)
        if found is not None:
            if found.state != "COMPLETED":
                raise InvalidArgumentError(
                    f"checkpoint {checkpoint} is {found.state.lower()}; only a completed one is "
                    "registered (`lightning-bridge checkpoint list`)."
                )
            trial_run = self.mirror.sync_trial(found.trial_id)
            run = self.client.get_run(trial_run)
            run_id: str | None = trial_run
            reference = run.data.tags.get(f"{TAG}checkpoint.{found.uuid}", "")
            source = (
                reference
                if _remote(reference)
                else f"{run.info.artifact_uri.rstrip('/')}/checkpoints/{found.uuid}"
            )
            tags = {
                f"{TAG}checkpoint_uuid": found.uuid,
                f"{TAG}trial_id": str(found.trial_id),
                f"{TAG}experiment_id": str(found.experiment_id),
                f"{TAG}batches": str(found.batches),
                f"{TAG}location": found.location,
            }
            tags.update({f"metric.{k}": str(v) for k, v in found.metrics.items()})
        else:
            source, run_id, tags = self._foreign(checkpoint)
        version = self.client.create_model_version(
            name, source, run_id=run_id, tags=tags, description=description or None
        )
        for alias in aliases:
            self.client.set_registered_model_alias(name, alias, version.version)
        return version_json(self.client.get_model_version(name, version.version))

    def _foreign(self, checkpoint: str) -> tuple[str, str | None, dict[str, str]]:
        """A checkpoint the record does not know: a folder or a storage URI. Checked with the
        safe loader; a remote URI is referenced, a local folder logged by an import run."""
        from lightning_bridge.checkpoint._safe_load import read_checkpoint

        hint = "nothing: a checkpoint that needs full unpickling is not registered"
        tags = {f"{TAG}imported_from": checkpoint}
        if _remote(checkpoint):
            import fsspec

            with tempfile.TemporaryDirectory(prefix="lightning-bridge-model-") as tmp:
                fs, path = fsspec.core.url_to_fs(checkpoint)
                if not fs.isdir(path):
                    raise InvalidArgumentError(
                        f"{checkpoint} is neither a checkpoint of this workspace nor a "
                        "checkpoint folder in storage."
                    )
                fs.get(path.rstrip("/") + "/", tmp + "/", recursive=True)
                read_checkpoint(tmp, trust_hint=hint)
            return checkpoint, None, tags
        folder = pathlib.Path(checkpoint).expanduser()
        if not folder.is_dir():
            raise InvalidArgumentError(
                f"{checkpoint} is neither a checkpoint uuid of the workspace "
                f"{self.registry.workspace.root} nor a checkpoint folder or storage URI "
                "(`lightning-bridge checkpoint list` shows the checkpoints kept)."
            )
        read_checkpoint(folder, trust_hint=hint)
        experiment = self.client.get_experiment_by_name(IMPORTED_EXPERIMENT)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(IMPORTED_EXPERIMENT)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=folder.resolve().name,
            tags={f"{TAG}imported_from": str(folder.resolve())},
        )
        self.client.log_artifacts(run.info.run_id, str(folder), "checkpoint")
        self.client.set_terminated(run.info.run_id)
        return f"{run.info.artifact_uri.rstrip('/')}/checkpoint", run.info.run_id, tags

    def models(self) -> list[dict[str, Any]]:
        return [model_json(m, []) for m in self.client.search_registered_models()]

    def versions(self, name: str) -> list[dict[str, Any]]:
        aliases = dict(getattr(self._model(name), "aliases", None) or {})
        found = self.client.search_model_versions(f"name = '{_escaped(name)}'")
        versions = []
        for version in found:  # a search's answer leaves the aliases out: the model has them
            shown = version_json(version)
            shown["aliases"] = sorted(a for a, v in aliases.items() if str(v) == shown["version"])
            versions.append(shown)
        return sorted(versions, key=lambda v: int(v["version"]))

    def describe(self, name: str) -> dict[str, Any]:
        return model_json(self._model(name), self.versions(name))

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def download(self, model_uri: str, out: pathlib.Path) -> tuple[dict[str, Any], pathlib.Path]:
        """Copy the checkpoint of a model version into `out`; the version and the folder."""
        match = _MODEL_URI.match(model_uri)
        if match is None:
            raise InvalidArgumentError(
                f"{model_uri!r} is not a model version: use models:/NAME/VERSION or "
                "models:/NAME@ALIAS."
            )
        name = match["name"]
        self._model(name)
        if match["alias"]:
            version = self.client.get_model_version_by_alias(name, match["alias"])
        else:
            version = self.client.get_model_version(name, match["version"])
        out.mkdir(parents=True, exist_ok=True)
        source = str(version.source)
        if _remote(source) and not source.startswith(("mlflow-artifacts:", "runs:", "http")):
            import fsspec

            fs, path = fsspec.core.url_to_fs(source)
            fs.get(path.rstrip("/") + "/", str(out) + "/", recursive=True)
        else:
            from mlflow.artifacts import download_artifacts

            # The version's own location (a `models:/` URI would be resolved against the
            # default registry, not this one).
            where = self.client.get_model_version_download_uri(name, version.version)
            with tempfile.TemporaryDirectory(prefix=".download-", dir=out) as tmp:
                got = pathlib.Path(
                    download_artifacts(
                        artifact_uri=where, dst_path=tmp, tracking_uri=self.mirror.uri
                    )
                )
                for item in got.iterdir():
                    item.replace(out / item.name)
        return version_json(version), out


def _escaped(value: str) -> str:
    return value.replace("'", "\\'")


def model_json(model: Any, versions: list[dict[str, Any]]) -> dict[str, Any]:
    aliases = getattr(model, "aliases", None) or {}
    latest = [int(v.version) for v in (getattr(model, "latest_versions", None) or [])]
    return {
        "name": model.name,
        "description": model.description or "",
        "creation_timestamp": model.creation_timestamp,
        "last_updated_timestamp": model.last_updated_timestamp,
        "aliases": dict(aliases),
        "latest_version": max(latest) if latest else None,
        "versions": versions,
    }


def version_json(version: Any) -> dict[str, Any]:
    return {
        "name": version.name,
        "version": str(version.version),
        "source": version.source,
        "run_id": version.run_id,
        "status": version.status,
        "aliases": list(getattr(version, "aliases", None) or []),
        "description": version.description or "",
        "tags": dict(version.tags or {}),
        "creation_timestamp": version.creation_timestamp,
    }
