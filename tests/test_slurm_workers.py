"""`run --launcher slurm --worker-jobs N`: a search's trials in long-running Slurm worker jobs,
each forking its trials from a warm process, on the two-node test cluster (marker `slurm`);
and the refusals that need no cluster.

Every search in worker jobs is compared with the same search run locally: the same trials
(hyperparameters) end with the same weights, bit for bit.
"""

from __future__ import annotations

import copy
import pathlib
import re

import pytest
import torch

from lightning_bridge.experiment.cli._main import main
from lightning_bridge.experiment.config._config import load_config
from lightning_bridge.experiment.config._plan import Options, prepare
from lightning_bridge.experiment.searches import _slurm_workers
from lightning_bridge.experiment.searches._search_to_serve import SearchToServe
from lightning_bridge.experiment.searches._slurm_workers import WorkerJobs, check_worker_jobs
from lightning_bridge.record._registry import Registry
from lightning_bridge.search import SearchDriver
from tests import _folders as sf
from tests._folders import checkpoint_weights, weights_by_hparams
from tests._servers import PostgresServer
from tests._slurm_cluster import SlurmCluster
from tests.test_slurm import (  # noqa: F401 - fixtures
    _config,
    _folder,
    _job,
    _same,
    _search_trials,
    _shown,
    _trial,
    _wait_for,
    finish,
    isolated_imports,
    lb,
    lb_start,
    local_weights,
    on_slurm,
    slurm_cluster_fixture,
)

# A random search of two trials of the tiny trial, both at once, 16 batches each.
RANDOM = {
    **copy.deepcopy(sf.SEARCH_CONFIG),
    "searcher": {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": 2,
        "max_length": {"batches": 16},
        "max_concurrent_trials": 2,
    },
    "min_checkpoint_period": {"batches": 4},
}


def _submitted(out: str) -> list[str]:
    """The worker jobs a coordinator's output says it submitted."""
    return re.findall(r"Search worker: Slurm job (\d+) submitted", out)


def _in_worker_jobs(
    path: pathlib.Path, ws: pathlib.Path, jobs: int, gate: sf.Gate, held: int, verb: str
) -> str:
    """Run the search at `path` (its trials held at `gate`) in `jobs` worker jobs into `ws`;
    once `held` trials are held there, `experiment VERB 1` (pause, kill). The coordinator's
    output, once it ended with 0."""
    args = on_slurm(path, ws, "--worker-jobs", str(jobs))
    coordinator = lb_start(*args, cwd=path.parent.parent)
    try:
        gate.wait(held, seen=lambda: _search_trials(ws))
        assert main(["experiment", verb, "1", "--workspace", str(ws)]) == 0
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    return out


# ----- no cluster needed -----


def test_worker_jobs_refused_where_they_cannot_apply(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = sf.write_folder(tmp_path, RANDOM, "search", sf.TINY)
    ws = ["--workspace", str(tmp_path / "ws")]
    assert main(["run", str(search), "--worker-jobs", "2", *ws]) == 2
    err = capsys.readouterr().err
    assert "--worker-jobs runs a search's trials in Slurm jobs; add --launcher slurm" in err
    single = _folder(tmp_path, _config(), "single")
    assert main(["run", str(single), "--launcher", "slurm", "--worker-jobs", "2", *ws]) == 2
    assert "this run trains one trial" in capsys.readouterr().err
    assert not (tmp_path / "ws" / "experiments").exists()  # nothing recorded

    across = _config(resources={"slots_per_trial": 4}, slurm={"slots_per_node": 2})
    plan = prepare(_folder(tmp_path, across, "across"), None, Options(launcher="slurm"))
    with pytest.raises(Exception, match="spans 2 nodes .* leave --worker-jobs out"):
        check_worker_jobs(plan, 2)
    with pytest.raises(Exception, match="expected a positive count, got 0"):
        check_worker_jobs(prepare(single, None, Options(launcher="slurm")), 0)


# ----- on the cluster -----


@pytest.mark.slurm
def test_a_search_in_worker_jobs_pauses_continues_and_equals_the_local_search(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two trials in two worker jobs: `experiment pause` while they train (they checkpoint
    and stop, the coordinator stops the jobs and ends), `experiment continue --worker-jobs
    1`: the paused trials go on from their checkpoints in one new worker job, one after the
    other (forked, not started cold), each trial's record names its job, and every trial
    ends with the local search's weights."""
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(RANDOM)
    config["hyperparameters"].update(gate.hparams(4))
    path = sf.write_folder(tmp_path, config, "exp", sf.TINY)
    local = lb(
        "run",
        str(sf.write_folder(tmp_path, RANDOM, "exp-local", sf.TINY)),
        "--workspace",
        str(tmp_path / "local"),
        "--accelerator",
        "cpu",
        cwd=tmp_path,
        timeout=400,
    )
    assert local.returncode == 0, _shown(local)

    ws = tmp_path / "ws"
    out = _in_worker_jobs(path, ws, 2, gate, 2, "pause")  # both trials held after 4 batches
    assert "checkpoints and stops" in capsys.readouterr().out
    assert len(_submitted(out)) == 2, out[-4000:]
    assert "The search stopped" in out, out[-4000:]
    paused = _search_trials(ws)
    assert paused and not any(t.state == "ACTIVE" for t in paused), paused
    assert any(0 < t.batches_trained < 16 for t in paused), paused
    _wait_for(lambda: not slurm_cluster.jobs(under=tmp_path), 30, "squeue to list no job")

    gate.release()
    resume = ["experiment", "continue", "1", "--workspace", str(ws), "--worker-jobs", "1"]
    done = lb(*resume, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, _shown(done)
    second = _submitted(done.stdout)
    assert len(second) == 1, _shown(done)
    assert "finished, 2 trials in all" in done.stdout, _shown(done)
    with Registry(ws) as registry:
        trials = registry.trials(1)
        jobs = {j.trial_id: j for j in registry.jobs(1)}
    assert len(trials) == 2 and all(t.state == "COMPLETED" for t in trials), trials
    assert all(t.batches_trained == 16 for t in trials), trials
    stopped = {t.id for t in paused if t.state == "STOPPED"}
    assert stopped and all(t.runs == 2 for t in trials if t.id in stopped), trials
    assert set(jobs) == {t.id for t in trials}
    for job in jobs.values():
        assert job.launcher == "slurm" and job.job_id in second and job.state == "COMPLETED"
        assert job.reason == f"a trial of search worker job {job.job_id}", job
    assert [j.job_id for j in jobs.values()] == second * 2, jobs  # one job ran both
    for job_id in second:
        output = (ws / "experiments/1/workers" / f"slurm-{job_id}.out").read_text()
        assert f"Search worker in Slurm job {job_id}" in output, output[-3000:]
        assert "start cold" not in output, output[-3000:]  # forked from the warm process
    describe = lb("experiment", "describe", "1", "--workspace", str(ws), cwd=tmp_path).stdout
    some = jobs[trials[0].id].job_id
    assert f"slurm job {some} COMPLETED, a trial of search worker job {some}" in describe

    reference = weights_by_hparams(tmp_path / "local")
    ours = weights_by_hparams(ws, leave_out=("gate", "hold_at"))
    assert ours.keys() == reference.keys()
    for key in ours:
        _same(ours[key], reference[key])


@pytest.mark.slurm
def test_a_requeued_worker_job_continues_its_trial_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],  # noqa: F811 - the fixture
) -> None:
    """A worker job requeued twice mid-trial: by `scontrol requeue` (as a preemption), then
    by itself after the time limit's signal (SIGUSR1 to its batch shell, as
    `--signal=B:USR1@120` sends it). Each time its trial checkpoints and is given back, and
    the requeued job's worker takes it again and continues it from that checkpoint: one job,
    requeued twice, the trial in 3 runs, and the uninterrupted local run's weights."""
    ws = tmp_path / "ws"
    searcher = {**_config()["searcher"], "name": "random", "max_trials": 1}
    config = _folder(tmp_path, _config(searcher=searcher))
    gate = sf.Gate.at(tmp_path / "gate")
    args = on_slurm(config, ws, "--worker-jobs", "1", *gate.options([6, 12]))
    coordinator = lb_start(*args, cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _search_trials(ws))  # after 6 batches
        job_id = _job(ws).job_id
        slurm_cluster.run("scontrol", "requeue", job_id)
        _wait_for(lambda: _trial(ws).runs == 2, 120, "the requeued job to continue the trial")
        gate.wait(2, seen=lambda: _search_trials(ws))  # continued, held after 12 batches
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job_id)
    finally:
        out = finish(coordinator, timeout=300)
    assert coordinator.returncode == 0, out[-4000:]
    assert _submitted(out) == [job_id], out[-4000:]
    assert out.count(f"Slurm job {job_id} was requeued") == 2, out[-4000:]
    assert "its time limit is near: its trials checkpointed" in out, out[-4000:]
    assert "finished, 1 trials in all" in out, out[-4000:]
    trial = _trial(ws)
    assert trial.state == "COMPLETED" and trial.batches_trained == 24 and trial.runs == 3, trial
    job = _job(ws)
    assert job.job_id == job_id and job.state == "COMPLETED" and job.restarts == 2, job
    with Registry(ws) as registry:
        latest = registry.latest_checkpoint(1)
    assert latest is not None
    _same(checkpoint_weights(pathlib.Path(latest.location)), local_weights)


@pytest.mark.slurm
def test_experiment_kill_cancels_the_worker_jobs_and_gives_their_trials_back(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`experiment kill` while the first trial trains in the search's worker job: the job is
    cancelled (the trial with it, recorded STOPPED "killed"), the coordinator gives the
    trial back in the search and ends; no job is left, and the search can go on."""
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(RANDOM)
    config["hyperparameters"].update(gate.hparams(1))
    path = sf.write_folder(tmp_path, config, "exp", sf.TINY)
    ws = tmp_path / "ws"
    out = _in_worker_jobs(path, ws, 1, gate, 1, "kill")  # held after its first batch
    assert "killed" in capsys.readouterr().out
    assert "The search stopped" in out, out[-4000:]
    _wait_for(lambda: not slurm_cluster.jobs(under=tmp_path), 30, "squeue to list no job")
    with Registry(ws) as registry:
        trials = registry.trials(1)
        jobs = {j.trial_id: j for j in registry.jobs(1)}
    killed = [t for t in trials if "killed" in (t.message or "")]
    assert killed and all(t.state == "STOPPED" and t.batches_trained < 16 for t in killed), (
        trials,
        out[-3000:],
    )
    assert not any(t.state == "ACTIVE" for t in trials), trials
    assert all(jobs[t.id].state == "CANCELLED" for t in killed), jobs
    search = re.search(r"search (\S+) \(storage", out)
    assert search is not None
    driver = SearchDriver(str(ws / "experiments/1/search.journal"), search.group(1))
    try:  # nothing is left running in the search: the killed trials are pending again
        views = {v.number: v.state for v in driver.trials()}
        finished = driver.is_finished()
    finally:
        driver.close()
    assert "running" not in views.values() and not finished, views


@pytest.mark.search
@pytest.mark.postgres
def test_the_coordinator_of_worker_jobs_rides_out_a_storage_restart(
    tmp_path: pathlib.Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search's storage (PostgreSQL) restarts while the coordinator follows its worker
    jobs: its polls say so once and go on (the jobs train meanwhile); once the server is
    back, it opens the storage anew. Away longer than the bound, the error ends it."""
    path = sf.write_folder(tmp_path, copy.deepcopy(RANDOM), "exp", sf.TINY)
    config = load_config(path)
    storage = postgres.new_database()
    said: list[str] = []
    with Registry(tmp_path / "ws") as registry:
        registry.create_experiment(config.raw)
        jobs = WorkerJobs(
            registry,
            SearchDriver(storage, "s", config.search),
            SearchToServe(
                1,
                config,
                path.parent,
                Options(launcher="slurm", worker_jobs=1, accelerator="cpu"),
                storage,
                lost_after_s=300,
            ),
            say=said.append,
        )
        postgres.stop()
        try:
            jobs._turn_through_outages()
            jobs._turn_through_outages()
        finally:
            postgres.start()
        assert len(said) == 1 and said[0].startswith("The search storage is unavailable")
        before = jobs.driver
        jobs._turn_through_outages()
        assert jobs.driver is not before and not jobs.driver.is_finished()
        postgres.stop()
        try:
            jobs._turn_through_outages()
            monkeypatch.setattr(_slurm_workers, "RETRY_S", 0.0)
            with pytest.raises(Exception, match=r"(?i)connect|server"):
                jobs._turn_through_outages()
        finally:
            postgres.start()
        jobs.driver.close()
