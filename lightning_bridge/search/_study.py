"""The Optuna study that holds a search: created with the search's config the first time,
checked against it afterwards, so a search is only ever continued as it was started."""

from __future__ import annotations

import json
import secrets
from typing import Any

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.search._storage import import_optuna
from lightning_bridge.search._views import SearchSpec

_SEARCH = "lightning_bridge:search"  # study: the search's config and experiment seed


def open_study(storage: Any, name: str, spec: SearchSpec | None) -> tuple[SearchSpec, int]:
    """The stored search named `name` and its study id; created from `spec` when missing.

    A study made by something else, or a `spec` other than the stored one, is refused.
    """
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        if spec is None:
            raise InvalidArgumentError(
                f"no search named {name!r} in this storage; check the name and --storage"
            ) from None
        seed = spec.experiment_seed
        if seed is None:
            seed = secrets.randbelow(1 << 31)
        direction = import_optuna().study.StudyDirection
        study_id = storage.create_new_study(
            [direction.MINIMIZE if spec.searcher.smaller_is_better else direction.MAXIMIZE],
            name,
        )
        storage.set_study_system_attr(study_id, _SEARCH, spec.to_json(seed))
    stored = storage.get_study_system_attrs(study_id).get(_SEARCH)
    if stored is None:
        raise InvalidArgumentError(
            f"the study {name!r} in this storage was not made by lightning-bridge; "
            "give the search another name"
        )
    if spec is not None:
        given = spec.to_json(stored["experiment_seed"])
        if spec.experiment_seed is None:
            given["experiment_seed"] = stored["experiment_seed"]
        if json.dumps(given, sort_keys=True) != json.dumps(stored, sort_keys=True):
            raise InvalidArgumentError(
                f"the search {name!r} in this storage was started with another searcher, "
                "hyperparameters or experiment seed; continue it as it was, or start a new "
                "search under another name"
            )
    return SearchSpec.from_json(stored), study_id
