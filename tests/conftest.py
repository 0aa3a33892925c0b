"""Shared fixtures: every test runs in its own working directory (logs, checkpoints); the
servers' fixtures (`postgres`) come from tests/_servers.py. The `lightning_api` marker is set
here, by module, and the modules are ordered for pytest-xdist, longest first."""

from __future__ import annotations

import os
import pathlib
import re
from collections import Counter
from collections.abc import Iterator

import pytest

# The Ray clusters' fixtures, defined once here: a session-scoped fixture imported into each
# test module would be a fixture of each module, and each module would start its own cluster.
from tests._ray_cluster import (  # noqa: F401  (fixtures)
    fresh_ray_cluster_fixture,
    ray_cluster_fixture,
    spare_ray_cluster_fixture,
    spare_ray_clusters_fixture,
)
from tests._servers import _postgres_server, postgres  # noqa: F401  (fixtures)

# The modules whose tests exercise what a Lightning release can change: the fit on Fabric
# (schedule, callbacks, checkpoints, resuming, DDP, AMP, reducers, a search's rungs in the
# fit), the adapter and the port on lightning.Trainer's API, Lightning's private names. The
# sessions of older Lightning versions run these only.
LIGHTNING_API = {
    "test_adapter",
    "test_adapter_distributed",
    "test_adapter_hooks",
    "test_adapter_real_world",
    "test_amp",
    "test_distributed",
    "test_lightning_private",
    "test_port",
    "test_reduction",
    "test_resume",
    "test_search_trial",
    "test_trainer",
    "test_trial_module_checkpoints",
    "test_trial_module_ecosystem",
    "test_trial_module_trainer",
}


@pytest.fixture(autouse=True)
def _workdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    # No MLflow mirror unless a test asks for one (the mlflow tests name their server).
    monkeypatch.setenv("LIGHTNING_BRIDGE_MLFLOW", "off")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield tmp_path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`lightning_api` on the tests of LIGHTNING_API's modules. Tests marked `slurm` or `ray`
    start a Slurm or a Ray cluster: they run only when `-m` names their marker (the slurm or
    the ray session), never as part of another selection."""
    for item in items:
        if item.path.stem in LIGHTNING_API:
            item.add_marker(pytest.mark.lightning_api)
    for marker, cluster in (("slurm", "Slurm"), ("ray", "Ray")):
        if re.search(rf"\b{marker}\b", config.option.markexpr or ""):
            continue
        skip = pytest.mark.skip(reason=f"needs the {cluster} test cluster: run with -m {marker}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


# The marks of tests that start processes of their own (trials, torchrun, the console
# script): what makes a module take minutes instead of seconds.
PROCESS_MARKS = ("slow", "processes", "search", "postgres")


class _LongestModulesFirst:
    """Orders the selected tests so that the modules with the most tests that start processes
    come first, the in-process modules after (each module's tests, and modules of equal
    weight, in their collected order). The sessions' xdist (`--dist loadscope
    --no-loadscope-reorder`) hands modules to workers in this order: the long modules start
    while every worker is busy and the short ones fill the end, so no worker idles through the
    last long module."""

    @pytest.hookimpl(trylast=True)  # after the deselection by -m / -k
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        weight: Counter[pathlib.Path] = Counter()
        for item in items:
            if any(item.get_closest_marker(mark) for mark in PROCESS_MARKS):
                weight[item.path] += 1
        collected = {path: i for i, path in enumerate(dict.fromkeys(i.path for i in items))}
        items.sort(key=lambda item: (-weight[item.path], collected[item.path]))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongestModulesFirst(), "lightning-bridge-module-order")
