"""One search served by two machines, simulated by two worker processes with workspaces of
their own: `lightning-bridge run --storage URL` on one, `lightning-bridge search-worker NAME
--storage URL` on the other. Through a journal file, with the second worker killed outright
(its trials are given back and the first finishes them); through a real PostgreSQL server
(the `postgres` fixture starts one).
"""

from __future__ import annotations

import contextlib
import copy
import os
import pathlib
import re
import signal
import socket

import pytest

from lightning_bridge.experiment.config._config import load_config
from lightning_bridge.experiment.config._plan import Options
from lightning_bridge.experiment.searches._search_to_serve import SearchToServe
from lightning_bridge.experiment.searches._worker import SearchWorker
from lightning_bridge.record._registry import Registry
from lightning_bridge.search import SearchDriver
from tests import _folders as sf
from tests._servers import PostgresServer

pytest.importorskip("optuna")

# Three trials at once: each worker has room for two on this machine, so both take some.
SEARCH = {
    **sf.SEARCH_CONFIG,
    "searcher": {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": 3,
        "max_length": {"batches": 12},
        "max_concurrent_trials": 3,
    },
}


def _trials(workspace: pathlib.Path) -> list[object]:
    if not (workspace / "registry.sqlite").is_file():
        return []
    with Registry(workspace) as registry:
        return list(registry.trials())


def _two_workers(tmp_path: pathlib.Path, storage: str, kill: bool) -> None:
    # Every trial is held after 4 batches until all three are held: the first machine holds
    # two, so the second has taken the third before any can end.
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(SEARCH)
    config["hyperparameters"].update(gate.hparams(4))
    path = sf.write_folder(tmp_path, config, "folder", sf.TINY)
    first, second = tmp_path / "machine-a", tmp_path / "machine-b"
    # Killed: the other worker takes the dead one's trials after 5 s. Otherwise both stay
    # alive, and a bound that short under a loaded machine's stalls gave a live worker's trial
    # away once (CI, load 6): the test is about sharing the search, not about that bound.
    common = ["--storage", storage, "--lost-after", "5" if kill else "120"]
    run = sf.start(["run", str(path), "--workspace", str(first), *common], tmp_path,
                   tmp_path / "a.log")  # fmt: skip

    def announced() -> str | None:
        found = re.search(r"search-worker (\S+) --storage", (tmp_path / "a.log").read_text())
        return found.group(1) if found else None

    name = sf.wait_for(announced, run, 300, "the run to name its search", tmp_path / "a.log")
    worker = sf.start(["search-worker", name, "--workspace", str(second), *common], tmp_path,
                      tmp_path / "b.log")  # fmt: skip
    try:
        sf.wait_for(lambda: gate.reached() == 3, worker, 240, "3 trials held", tmp_path / "b.log")
        if kill:
            # Lose the second machine while its trial trains: the worker and its trial die
            # at once, without giving anything back.
            # Each trial runs in a process group of its own: the worker's group is frozen
            # first (nothing of it sees its trials end), then the trials and the worker die.
            running = [t.pid for t in _trials(second) if t.state == "ACTIVE" and t.pid]  # type: ignore[attr-defined]
            os.killpg(worker.pid, signal.SIGSTOP)
            for pid in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
        gate.release()
        out_a = sf.finish_logged(run, tmp_path / "a.log")
        assert run.returncode == 0, out_a
        if not kill:
            out_b = sf.finish_logged(worker, tmp_path / "b.log")
            assert worker.returncode == 0, out_b
    finally:
        for process in (run, worker):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    driver = SearchDriver(storage, name)
    views = driver.trials()
    assert driver.is_finished()
    driver.close()
    assert [v.state for v in views] == ["completed"] * 3
    on_a, on_b = _trials(first), _trials(second)
    assert on_a and on_b, "each machine took trials"
    seeds_a = {t.seed for t in on_a if t.state == "COMPLETED"}  # type: ignore[attr-defined]
    seeds_b = {t.seed for t in on_b if t.state == "COMPLETED"}  # type: ignore[attr-defined]
    if kill:
        # The killed machine completed nothing; the first ran every trial to its end,
        # including the one given back when its worker went silent.
        assert not seeds_b and seeds_a == {v.seed for v in views}
        assert "its worker was not heard of; pending again" in out_a
    else:
        assert seeds_a | seeds_b == {v.seed for v in views} and not seeds_a & seeds_b
        assert f"serving search {name}" in out_b


@pytest.mark.slow
@pytest.mark.search
def test_a_killed_worker_s_trials_are_finished_by_the_other(tmp_path: pathlib.Path) -> None:
    _two_workers(tmp_path, str(tmp_path / "shared" / "search.journal"), kill=True)


@pytest.mark.search
@pytest.mark.postgres
def test_a_second_machine_serves_a_postgresql_search(
    tmp_path: pathlib.Path, postgres: PostgresServer
) -> None:
    _two_workers(tmp_path, postgres.url, kill=False)


def _worker_on(
    host: str, workspace: pathlib.Path, storage: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[SearchDriver, SearchWorker]:
    """A search worker as `search-worker` builds it, on a node named `host`: its driver and
    its `SearchWorker` (nothing started)."""
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    path = sf.write_folder(workspace.parent, copy.deepcopy(SEARCH), "folder", sf.TINY)
    config = load_config(path)
    driver = SearchDriver(storage, name, config.search)
    registry = Registry(workspace)
    if not registry.experiments():
        registry.create_experiment(config.raw, context_dir=str(path.parent))
    worker = SearchWorker(
        registry, driver, SearchToServe(1, config, path.parent, Options(accelerator="cpu"), storage)
    )
    return driver, worker


@pytest.mark.search
@pytest.mark.postgres
def test_a_trial_given_back_on_one_node_keeps_its_record_on_another(
    tmp_path: pathlib.Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes' workers share the workspace and its record (PostgreSQL, as a search across
    nodes has it; here one folder). A trial the first node's worker recorded and gave back
    (its job requeued, paused) is the same recorded trial when the second node's worker pulls
    it: continued, not recorded anew to start over. With a record of the machine's own (an
    SQLite file), another machine's worker records it anew in its own workspace."""
    storage = str(tmp_path / "search.journal")
    for shared, expected in ((True, [1, 1]), (False, [1, 2])):
        ws = tmp_path / ("shared" if shared else "own") / "ws"
        ws.mkdir(parents=True)
        if shared:
            (ws / "workspace.json").write_text(f'{{"record": "{postgres.new_database()}"}}')
        name = f"search-{shared}"
        recorded = []
        for host in ("node-a", "node-b"):
            driver, worker = _worker_on(host, ws, storage, name, monkeypatch)
            spec = driver.next_trial()
            assert spec is not None
            recorded.append(worker._record(spec).trial_id)
            driver.pause(spec)
            worker.registry.close()
            driver.close()
        assert recorded == expected, (shared, recorded)
