"""`--launcher slurm`: trials as sbatch jobs on a real two-node Slurm cluster (marker `slurm`,
the cluster of `_slurm_cluster`), and the refusals and sbatch options that need no cluster.

The trial is the CLI tests' linear trial, held at a batch by the test's gate (`sf.Gate`) so
that a test can requeue or pause its job mid-run; every run on Slurm is compared with the same
trial run locally (the local launcher, in this process): same final weights, bit for bit.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import yaml

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge.experiment.cli._main import main
from lightning_bridge.experiment.config._plan import Options, prepare
from lightning_bridge.experiment.launch.slurm._launcher import JobInfo, SlurmSettings
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from lightning_bridge.record._workspace import Workspace
from tests import _folders as sf
from tests._folders import (  # noqa: F401 - fixture
    BASE_CONFIG,
    checkpoint_weights,
    isolated_imports,
)
from tests._folders import LINEAR_MODEL_DEF as MODEL_DEF
from tests._slurm_cluster import (
    SlurmCluster,
    exclusive,
    shared_folder,
    slurm_cluster_fixture,  # noqa: F401 - fixture
)

# The linear trial, held at the test's gate (`sf.GATE_CODE`: `gate`, `hold_at`), sleeping
# `delay` seconds a batch (the two-node test: the pace of a multi-process fit's agreement on
# a signal), and raising once at batch `fail_once_at` (the first run of its folder: it leaves
# `failed-once` there); its __init__ also records its node's rank, the trial's node addresses
# (`get_cluster_info()`) and the variable FROM_HOOK (a startup hook's export) in
# init.RANK.json.
SLOW_MODEL_DEF = (
    (MODEL_DEF + sf.GATE_CODE)
    .replace("import signal\n", "import signal\nimport time\n\nimport determined\n")
    .replace(
        "        x, y = batch\n        loss = torch",
        "        hold_at_gate(self.context.get_hparams(), batch_idx)\n"
        "        time.sleep(self.context.get_hparams().get('delay', 0))\n"
        "        if self.context.get_hparams().get('fail_once_at') == batch_idx:\n"
        "            if not os.path.exists('failed-once'):\n"
        "                open('failed-once', 'w').close()\n"
        "                raise RuntimeError(f'deliberate failure at batch {batch_idx}')\n"
        "        x, y = batch\n        loss = torch",
    )
    .replace(
        "            seen += [d.get_cross_rank(), d.get_cross_size()]\n",
        "            seen += [d.get_cross_rank(), d.get_cross_size()]\n"
        "            info = determined.get_cluster_info()\n"
        "            seen += [info.container_rank, info.container_addrs]\n"
        "            seen.append(os.environ.get('FROM_HOOK'))\n",
    )
)
assert SLOW_MODEL_DEF.count("determined.get_cluster_info") == 1 and "failed-once" in SLOW_MODEL_DEF
assert SLOW_MODEL_DEF.count("hold_at_gate(") == 2


def _config(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        **BASE_CONFIG,
        "hyperparameters": dict(BASE_CONFIG["hyperparameters"]),
        "searcher": {**BASE_CONFIG["searcher"], "max_length": {"batches": 24}},
        "min_validation_period": {"batches": 8},
        "min_checkpoint_period": {"batches": 2},
        "max_restarts": 0,
    }
    config.update(changes)
    return config


def _folder(root: pathlib.Path, config: dict[str, Any], name: str = "exp") -> pathlib.Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_def.py").write_text(SLOW_MODEL_DEF)
    (folder / "const.yaml").write_text(yaml.safe_dump(config))
    return folder / "const.yaml"


def _final_weights(workspace: pathlib.Path, trial_id: int = 1) -> dict[str, torch.Tensor]:
    with Registry(workspace) as registry:
        latest = registry.latest_checkpoint(trial_id)
    assert latest is not None
    return checkpoint_weights(pathlib.Path(latest.location))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_bridge", *args]


def _env() -> dict[str, str]:
    root = str(pathlib.Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def on_slurm(config: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    """`run CONFIG --launcher slurm` on CPUs into `workspace` (`extra`: more options)."""
    return ["run", str(config), "--launcher", "slurm", "--accelerator", "cpu"] + [
        "--workspace",
        str(workspace),
        *extra,
    ]


def lb(
    *args: str, cwd: pathlib.Path, timeout: float = 400, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`lightning-bridge ARGS` run to its end, as a user runs it (its output captured; `env`:
    more environment)."""
    return subprocess.run(
        _cli(*args),
        cwd=cwd,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def lb_start(*args: str, cwd: pathlib.Path) -> subprocess.Popen[str]:
    """`lightning-bridge ARGS` started (stdout and stderr together), for a test to act on
    while it runs; `finish` waits for it."""
    return subprocess.Popen(
        _cli(*args),
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 240) -> str:
    """Wait for a started command (killed if it outlives `timeout`); its output."""
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return out


def _shown(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The trial's final weights run locally (in a subprocess, as a user runs it), once for
    the session's workers (the first one to need them runs it, the others read its file)."""
    saved = shared_folder(tmp_path_factory) / "slurm-local-weights.pt"
    with exclusive(saved.with_suffix(".lock")):
        if saved.is_file():
            loaded: dict[str, torch.Tensor] = torch.load(saved, weights_only=True)
            return loaded
        root = tmp_path_factory.mktemp("local")
        config = _folder(root, _config())
        args = ["run", str(config), "--workspace", str(root / "ws"), "--accelerator", "cpu"]
        done = lb(*args, cwd=root)
        assert done.returncode == 0, _shown(done)
        weights = _final_weights(root / "ws")
        torch.save(weights, saved)
        return weights


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _trial_batches(workspace: pathlib.Path) -> int:
    if not Workspace(workspace).registry_path.exists():
        return 0
    try:
        with Registry(workspace) as registry:
            trials = registry.trials()
            return trials[0].batches_trained if trials else 0
    except Exception:  # noqa: BLE001 - the registry being created
        return 0


def _job(workspace: pathlib.Path, trial_id: int = 1) -> Any:
    with Registry(workspace) as registry:
        return registry.job(trial_id)


def _trial(workspace: pathlib.Path, trial_id: int = 1) -> Any:
    with Registry(workspace) as registry:
        return registry.trial(trial_id)


def _seen(workspace: pathlib.Path) -> str:
    """What the record shows of experiment 1's trials and jobs (for a failure's message)."""
    if not Workspace(workspace).registry_path.exists():
        return "no record yet"
    try:
        with Registry(workspace) as registry:
            return f"trials {registry.trials()}; jobs {registry.jobs(1)}"
    except Exception as error:  # noqa: BLE001 - the registry being created
        return f"the record unreadable: {error!r}"


def _ends_as_uninterrupted(
    workspace: pathlib.Path,
    local_weights: dict[str, torch.Tensor],
    restarts: int,
    runs: int | None = None,
) -> None:
    """The trial's (last) job COMPLETED after `restarts` requeues, the trial trained its 24
    batches in `runs` runs (`restarts + 1`: one job), and its weights are the uninterrupted
    local run's, bit for bit."""
    job = _job(workspace)
    assert job.state == "COMPLETED" and job.restarts == restarts, job
    trial = _trial(workspace)
    assert trial.state == "COMPLETED" and trial.batches_trained == 24, trial
    assert trial.runs == (restarts + 1 if runs is None else runs), trial
    _same(_final_weights(workspace), local_weights)


# ----- no cluster needed -----


def test_sbatch_options_map_determined_keys(tmp_path: pathlib.Path) -> None:
    config = _config(
        resources={"slots_per_trial": 4, "resource_pool": "gpu-a100"},
        slurm={"slots_per_node": 2, "gpu_type": "a100", "sbatch_args": ["--time=01:00:00"]},
        max_restarts=3,
    )
    settings = SlurmSettings.of(prepare(_folder(tmp_path, config), None, Options()))
    assert settings.nodes == 2 and settings.partition == "gpu-a100"
    assert settings.resources(gpus=True) == [
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gres=gpu:a100:2",
    ]
    assert settings.sbatch_args == ("--time=01:00:00",) and settings.max_restarts == 3
    one_node = SlurmSettings.of(prepare(_folder(tmp_path, _config(), "one"), None, Options()))
    assert one_node.resources(gpus=False) == ["--nodes=1", "--ntasks=1", "--cpus-per-task=1"]


def test_a_job_slurm_is_signalling_or_staging_out_still_runs_its_trial() -> None:
    """Slurm shows a running job SIGNALING while it sends the job's `--signal` before the time
    limit (and STAGE_OUT, RESIZING on the way); the coordinator follows such a job on instead
    of giving the trial up as ended ("its Slurm job ended SIGNALING") while the job checkpoints
    and requeues itself. Ended jobs are still ended."""
    for state in ("SIGNALING", "STAGE_OUT", "RESIZING", "STOPPED", "REQUEUE_HOLD", "RUNNING"):
        assert JobInfo(state, "", 0).live, state
    for state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        assert not JobInfo(state, "", 0).live, state


def test_the_job_restarts_a_failed_trial_as_many_times_as_its_config_says(
    tmp_path: pathlib.Path,
) -> None:
    """The job reads `max_restarts` from the run description the launcher wrote (the config
    model's value, Determined's default 5 when the config names none); a run file written
    before the field existed still gets its config's value."""
    from lightning_bridge.experiment.config._plan import TrialRun
    from lightning_bridge.experiment.launch.slurm._job import restarts_allowed
    from lightning_bridge.experiment.trial_process._execute import describe_run
    from lightning_bridge.translation.services._run_description import RunDescription

    def described(config: dict[str, Any], name: str) -> RunDescription:
        plan = prepare(_folder(tmp_path, config, name), None, Options())
        trial_dir = tmp_path / name / "trial"
        trial = TrialRun(workspace=tmp_path, experiment_id=1, trial_id=1, trial_dir=trial_dir)
        describe_run(plan, trial).write(tmp_path / name / "run.json")
        return RunDescription.read(tmp_path / name / "run.json")

    assert restarts_allowed(described(_config(max_restarts=2), "two")) == 2
    unnamed = _config()
    unnamed.pop("max_restarts")
    assert restarts_allowed(described(unnamed, "default")) == 5
    older = described(_config(max_restarts=0), "older").to_json()
    older.pop("max_restarts")
    written_before = tmp_path / "older" / "run.json"
    written_before.write_text(json.dumps(older, default=str))
    assert restarts_allowed(RunDescription.read(written_before)) == 0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("--time=10", "slurm: expected a mapping (sbatch_args, slots_per_node)"),
        ({"sbatch_args": "--time=10"}, 'slurm.sbatch_args: expected a list of strings, e.g. ["'),
        ({"sbatch_args": ["--time=10", 3]}, "slurm.sbatch_args: expected a list of strings"),
        ({"slots_per_node": 0}, "slurm.slots_per_node: expected a positive integer, got 0"),
        ({"slots_per_node": "2"}, "slurm.slots_per_node: expected a positive integer, got '2'"),
        ({"gpu_type": 100}, "slurm.gpu_type: expected a string (the GPU type of --gres), got 100"),
    ],
)
def test_a_bad_slurm_section_is_one_line(
    tmp_path: pathlib.Path, section: Any, message: str
) -> None:
    """Determined's `slurm` keys and types, each bad one refused in one line."""
    plan = prepare(_folder(tmp_path, _config(slurm=section)), None, Options())
    with pytest.raises(InvalidArgumentError) as refused:
        SlurmSettings.of(plan)
    assert str(refused.value).startswith(message), refused.value
    assert "\n" not in str(refused.value)


def test_refused_without_sbatch(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _folder(tmp_path, _config())
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path / "nothing")
    try:
        code = main(["run", str(config), "--launcher", "slurm", "--workspace", "ws"])
    finally:
        os.environ["PATH"] = env_path
    assert code == 2
    assert "sbatch is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()  # nothing recorded


def test_continue_of_a_single_trial_runs_the_launchers_checks_first(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`experiment continue --launcher slurm` without sbatch is refused by the one pre-flight,
    as `run` is, before anything of the trial is touched (its folder, its log)."""
    folder = _folder(tmp_path, _config())
    ws = Workspace(tmp_path / "ws")
    with Registry(ws) as registry:
        experiment = registry.create_experiment(
            yaml.safe_load(folder.read_text()), context_dir=str(folder.parent)
        )
        trial_id = registry.create_trial(
            experiment, hparams={"global_batch_size": 8, "lr": 0.05}, seed=1
        )
        registry.trial_ended(trial_id, TrialState.STOPPED, "paused")  # to continue
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path / "nothing")
    try:
        args = ["experiment", "continue", str(experiment), "--launcher", "slurm"]
        code = main([*args, "--workspace", str(ws.root)])
    finally:
        os.environ["PATH"] = env_path
    assert code == 2
    assert "sbatch is not on PATH" in capsys.readouterr().err
    assert not ws.trial_dir(experiment, trial_id).exists()  # nothing of the trial touched


def test_a_job_across_nodes_runs_the_startup_hook_in_its_batch_shell(
    tmp_path: pathlib.Path,
) -> None:
    """The step a job across nodes runs in its batch shell before `srun` runs the folder's
    hook once and leaves its exports for the batch shell to source (any value, quoted); the
    tasks then do not run it again. A failing hook ends that step with its exit code."""
    from lightning_bridge.experiment.launch.slurm._launcher import HOOK_ENV
    from lightning_bridge.experiment.trial_process._startup_hook import RAN_ENV
    from lightning_bridge.translation.services._run_description import RunDescription

    run_file = tmp_path / "trial" / "run.json"
    run_file.parent.mkdir()
    RunDescription().write(run_file)
    odd = 'it\'s a "value"\non two lines $HOME'
    hook = f"echo ran >> runs.txt\nexport FROM_HOOK={shlex.quote(odd)}\n"
    (tmp_path / "startup-hook.sh").write_text(hook)
    step = [sys.executable, "-m", "lightning_bridge.experiment._slurm_job", "--before-tasks"]
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        [*step, str(run_file)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "startup-hook.sh: ++ echo ran" in done.stderr  # its output, in the job's
    shell = f"source {shlex.quote(str(run_file.with_name(HOOK_ENV)))}; env -0"
    sourced = subprocess.run(["bash", "-c", shell], env=env, capture_output=True, check=True)
    seen = dict(item.split("=", 1) for item in sourced.stdout.decode().split("\0") if item)
    assert seen["FROM_HOOK"] == odd and seen[RAN_ENV] == "1"
    assert (tmp_path / "runs.txt").read_text() == "ran\n"

    # A failing hook: the step ends with its exit code, and the trial is recorded ERROR with
    # the hook's message (what `experiment describe` and the coordinator show).
    from lightning_bridge.translation.services._run_description import RecordConnection

    ws = tmp_path / "ws"
    with Registry(ws) as registry:
        experiment = registry.create_experiment({})
        trial_id = registry.create_trial(experiment, hparams={}, seed=1)
    RunDescription(record=RecordConnection(str(ws), experiment, trial_id)).write(run_file)
    (tmp_path / "startup-hook.sh").write_text("exit 7\n")
    done = subprocess.run(
        [*step, str(run_file)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 7 and "startup-hook.sh failed with exit code 7" in done.stderr
    failed = _trial(ws, trial_id)
    assert failed.state == "ERROR" and "startup-hook.sh failed with exit code 7" in failed.message


def test_a_requeued_job_reads_its_run_file_once(tmp_path: pathlib.Path) -> None:
    """The job's process reads its run description once (its start-up checks, the requeued
    job's checkpoint, the trial and its ending share it) and trains the trial to its end; the
    fit's own `RunDescription.current()` is the trial's, not the job's, and is not counted."""
    from lightning_bridge.experiment.config._plan import TrialRun
    from lightning_bridge.experiment.trial_process._execute import describe_run

    config = _config(searcher={**BASE_CONFIG["searcher"], "max_length": {"batches": 4}})
    plan = prepare(_folder(tmp_path, config), None, Options(accelerator="cpu"))
    ws = tmp_path / "ws"
    with Registry(ws) as registry:
        experiment = registry.create_experiment(plan.config.raw)
        trial_id = registry.create_trial(experiment, hparams=plan.config.hparams, seed=1)
    trial = TrialRun(
        workspace=ws, experiment_id=experiment, trial_id=trial_id, trial_dir=tmp_path / "trial"
    )
    trial.trial_dir.mkdir()
    describe_run(plan, trial).write(trial.run_file)
    counting = (
        "import sys\n"
        "from lightning_bridge.translation.services._run_description import RunDescription\n"
        "from lightning_bridge.experiment.launch.slurm import _job\n"
        "read, reads = RunDescription.read.__func__, []\n"
        "def counted(cls, path):\n"
        "    if sys._getframe(1).f_code.co_name != 'current':\n"
        "        reads.append(str(path))\n"
        "    return read(cls, path)\n"
        "RunDescription.read = classmethod(counted)\n"
        "code = _job.main(sys.argv[1:])\n"
        "print('READS', len(reads), flush=True)\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    env.update(SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1", SLURM_NTASKS="1")
    done = subprocess.run(
        [sys.executable, "-c", counting, str(trial.run_file)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, _shown(done)
    assert "READS 1\n" in done.stdout, _shown(done)
    ended = _trial(ws, trial_id)
    assert ended.state == "COMPLETED" and ended.batches_trained == 4, ended


# ----- on the test cluster -----


# The longest first: xdist's workers take the tests in this order.


@pytest.mark.slurm
def test_a_job_environment_tells_a_cancelled_job_from_a_requeued_one(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a search's worker job asks when one of its trials ends (CANCELLED, or the job's
    part COMPLETED / FAILED): its environment says the job is ending for good once it is
    cancelled, not while it runs nor once it is requeued; the local launcher's never."""
    from lightning_bridge.translation.services._trial_environment import (
        SlurmJobEnvironment,
        TrialEnvironment,
    )

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)

    def running_job() -> str:
        sbatch = ["sbatch", "--parsable", "--requeue", f"--chdir={tmp_path}", "--wrap=sleep 300"]
        job_id = slurm_cluster.run(*sbatch).stdout.strip().split(";")[0]
        state = lambda: slurm_cluster.job(job_id).get("JobState")  # noqa: E731
        _wait_for(lambda: state() == "RUNNING", 120, f"job {job_id} to run")
        return job_id

    assert not TrialEnvironment().ending_for_good()
    jobs = [running_job(), running_job()]
    try:
        requeued, cancelled = (SlurmJobEnvironment(job_id=j, restart_count=0) for j in jobs)
        assert not requeued.ending_for_good() and not cancelled.ending_for_good()
        slurm_cluster.run("scontrol", "requeue", jobs[0])
        slurm_cluster.run("scancel", jobs[1])
        _wait_for(cancelled.ending_for_good, 60, f"job {jobs[1]} to be seen cancelled")
        assert slurm_cluster.job(jobs[0]).get("Restarts") == "1"
        assert not requeued.ending_for_good()
    finally:
        for job_id in jobs:
            slurm_cluster.run("scancel", job_id, check=False)


@pytest.mark.slurm
def test_two_node_trial_equals_its_two_process_single_node_run(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    """The 2-node job is also signalled mid-trial as its time limit's `--signal=B:USR1` does
    (only its batch shell, which `exec`s srun): srun passes SIGUSR1 on to both tasks, the trial
    checkpoints at its batch, the job requeues itself and both tasks continue from that
    checkpoint, to the weights and validations of the uninterrupted single-node run. The
    folder's startup hook runs once per run of the trial (in the job's batch shell: once per
    run of the job, not once per node) and every rank sees what it exports."""
    config = _config(resources={"slots_per_trial": 2}, slurm={"slots_per_node": 1})
    path = _folder(tmp_path, config)
    hook = 'echo ran >> hook-runs.txt\nexport FROM_HOOK="from the hook"\n'
    (path.parent / "startup-hook.sh").write_text(hook)
    runs = path.parent / "hook-runs.txt"
    results = {}
    for launcher in ("local", "slurm"):
        ws = tmp_path / f"ws-{launcher}"
        if launcher == "local":
            done = lb(*on_slurm(path, ws, "--launcher", launcher, "--force"), cwd=tmp_path)
            assert done.returncode == 0, _shown(done)
        else:
            # Both ranks are held after 6 batches until the signal. A fit of several
            # processes agrees on a signal every ~0.1 s of training (`_stop_request`): a
            # batch of 0.2 s (`delay`) makes that every batch, whatever the machine's load,
            # so the trial stops within its 24 batches (with batches of a millisecond the
            # next agreement falls after its end, and it completes unstopped).
            gate = sf.Gate.at(tmp_path / "gate")
            paced = ("--set", "hyperparameters.delay=0.2", *gate.options(6))
            coordinator = lb_start(*on_slurm(path, ws, *paced), cwd=tmp_path)
            try:
                gate.wait(2, seen=lambda: _seen(tmp_path / "ws-slurm"))  # both ranks, 6 batches
                job_id = _job(ws).job_id
                slurm_cluster.run("scancel", "--batch", "--signal=USR1", job_id)
            finally:
                out = finish(coordinator)
            assert coordinator.returncode == 0, out[-4000:]
            assert _job(ws).restarts == 1 and _trial(ws).runs == 2
            output = pathlib.Path(_job(ws).output).read_text()
            assert "its time limit is near: the trial checkpointed" in output, output[-3000:]
        with Registry(ws) as registry:
            results[launcher] = registry.metrics(1, "validation")
        seen = [json.loads((path.parent / f"init.{r}.json").read_text()) for r in (0, 1)]
        exported = "from the hook"
        if launcher == "local":  # one node: node rank 0 and one address for both processes
            assert [s[6:] for s in seen] == [[0, ["127.0.0.1"], exported]] * 2
            assert runs.read_text().split() == ["ran"]  # once, for both processes
        if launcher == "slurm":
            job = _job(ws)
            script = (ws / "experiments/1/trials/1/job.sh").read_text()
            assert "srun" in script and job.state == "COMPLETED"
            # What each rank's __init__ saw: rank and size from Slurm's two tasks (local and
            # cross sizes group ranks by host, and both test nodes are this one host); its
            # node's rank, and each node's address as `scontrol show node` gives it (both
            # test nodes have 127.0.0.1) in node-rank order.
            assert [s[:2] for s in seen] == [[0, 2], [1, 2]]
            addrs = ["127.0.0.1", "127.0.0.1"]
            assert [s[6:] for s in seen] == [[0, addrs, exported], [1, addrs, exported]]
            assert runs.read_text().split() == ["ran"] * 3  # and once per run of the job
        results[launcher + "-weights"] = _final_weights(ws)  # type: ignore[assignment]
    _same(results["local-weights"], results["slurm-weights"])  # type: ignore[arg-type]
    assert [m.values for m in results["local"]] == [m.values for m in results["slurm"]]


@pytest.mark.slurm
def test_refusals_before_submitting(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (_config(resources={"resource_pool": "nowhere"}), "'nowhere' is not a partition"),
        (_config(slurm={"slots_per_node": 64}), "no node of partition debug has that many"),
        (_config(slurm={"sbatch_args": ["--time=bogus"]}), "Slurm refuses the trial's job"),
    ]
    for number, (config, expected) in enumerate(cases):
        path = _folder(tmp_path, config, f"exp{number}")
        args = ["run", str(path), "--launcher", "slurm", "--accelerator", "cpu"]
        assert main([*args, "--workspace", "ws"]) == 2
        err = capsys.readouterr().err
        assert expected in err, err
    assert not slurm_cluster.jobs(under=tmp_path)
    assert not (tmp_path / "ws").exists()  # nothing recorded


@pytest.mark.slurm
def test_single_trial_is_a_job_with_the_local_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    ws = tmp_path / "ws"
    done = lb(*on_slurm(_folder(tmp_path, _config()), ws), cwd=tmp_path)
    assert done.returncode == 0, _shown(done)
    assert "Slurm job" in done.stdout
    _ends_as_uninterrupted(ws, local_weights, restarts=0)
    job = _job(ws)
    describe = lb("experiment", "describe", "1", "--workspace", str(ws), cwd=tmp_path).stdout
    assert f"slurm job {job.job_id} COMPLETED" in describe
    logs = lb("trial", "logs", "1", "--workspace", str(ws), cwd=tmp_path).stdout
    assert f"slurm job {job.job_id} (COMPLETED)" in logs and "Training" in logs


# The gate does not change the weights: the local run (never held) is the reference of every
# interrupted run.


def _requeued_mid_trial(
    cluster: SlurmCluster, config: pathlib.Path, ws: pathlib.Path
) -> tuple[str, str]:
    """Run `config` on Slurm into `ws` and `scontrol requeue` its job while the trial is held
    after 6 batches (it checkpoints there and stops); the coordinator ended with 0. Its output
    and the requeued job's id."""
    gate = sf.Gate.at(ws.parent / "gate")
    coordinator = lb_start(*on_slurm(config, ws, *gate.options(6)), cwd=config.parent.parent)
    try:
        gate.wait(seen=lambda: _seen(ws))
        job_id = _job(ws).job_id
        cluster.run("scontrol", "requeue", job_id)
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    return out, job_id


@pytest.mark.slurm
def test_requeued_job_continues_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    ws = tmp_path / "ws"
    _requeued_mid_trial(slurm_cluster, _folder(tmp_path, _config()), ws)
    _ends_as_uninterrupted(ws, local_weights, restarts=1)


@pytest.mark.slurm
def test_a_search_trial_whose_job_is_requeued_ends_with_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The same requeue in a search (one trial of the same hyperparameters). The stopped trial
    keeps its search trial (Slurm counted the requeue before it signalled the job), so the
    requeued job itself continues it from its checkpoint: one job for the trial, requeued
    once, no other submitted, and the uninterrupted weights."""
    ws = tmp_path / "ws"
    searcher = {**_config()["searcher"], "name": "random", "max_trials": 1}
    config = _folder(tmp_path, _config(searcher=searcher))
    out, first = _requeued_mid_trial(slurm_cluster, config, ws)
    assert "finished, 1 trials in all" in out, out[-4000:]
    started = [line for line in out.splitlines() if "bracket 0) " in line]  # submissions
    assert len(started) == 1 and ") starts:" in started[0], out[-4000:]
    assert _job(ws).job_id == first
    _ends_as_uninterrupted(ws, local_weights, restarts=1)
    trial_dir = ws / "experiments/1/trials/1"
    assert [p.name for p in trial_dir.glob("slurm-*.out")] == [f"slurm-{first}.out"]
    assert "The trial keeps its search trial" in (trial_dir / f"slurm-{first}.out").read_text()
    describe = lb("experiment", "describe", "1", "--workspace", str(ws), cwd=tmp_path).stdout
    assert f"slurm job {first} COMPLETED (requeued 1 times)" in describe, describe


# The slow trial as a Trainer-API script (`python3 train.py`): the fit's length is the run's
# (the searcher's 24 batches), its periods the config's, and it continues from the checkpoint
# the runner names.
SLOW_TRAIN_PY = """
import determined as det
from determined import pytorch
from model_def import LinearTrial

info = det.get_cluster_info()
with pytorch.init() as ctx:
    trainer = pytorch.Trainer(LinearTrial(ctx), ctx)
    trainer.fit(
        validation_period=pytorch.Batch(8),
        checkpoint_period=pytorch.Batch(2),
        latest_checkpoint=info.latest_checkpoint,
    )
"""


@pytest.mark.slurm
def test_a_script_search_trial_whose_job_is_requeued_keeps_its_trial(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The search requeue above with a Trainer-API script entrypoint, which trains in a child
    process of the job: that process too keeps its search trial when its job is requeued, so
    the requeued job continues it, no other job is submitted for it, and the trial is trained
    once (two runs of one job, 24 batches) to the uninterrupted weights."""
    ws = tmp_path / "ws"
    searcher = {**_config()["searcher"], "name": "random", "max_trials": 1}
    config = _folder(tmp_path, _config(searcher=searcher, entrypoint="python3 train.py"))
    (config.parent / "train.py").write_text(SLOW_TRAIN_PY)
    out, first = _requeued_mid_trial(slurm_cluster, config, ws)
    assert "finished, 1 trials in all" in out, out[-4000:]
    started = [line for line in out.splitlines() if "bracket 0) " in line]  # submissions
    assert len(started) == 1 and ") starts:" in started[0], out[-4000:]
    assert _job(ws).job_id == first
    _ends_as_uninterrupted(ws, local_weights, restarts=1)
    trial_dir = ws / "experiments/1/trials/1"
    assert [p.name for p in trial_dir.glob("slurm-*.out")] == [f"slurm-{first}.out"]
    output = (trial_dir / f"slurm-{first}.out").read_text()
    assert "The trial keeps its search trial" in output, output[-3000:]
    with Registry(ws) as registry:
        assert len(registry.trials()) == 1


@pytest.mark.slurm
def test_a_search_trial_that_fails_once_is_continued_by_its_requeued_job(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """`max_restarts: 1` in a search (one trial): the trial raises once, at its 12th batch
    (after its checkpoint at batch 10). It keeps its search trial, its job requeues itself and
    continues from that checkpoint: one job, requeued once, the uninterrupted weights, and the
    search finishes with the trial completed."""
    ws = tmp_path / "ws"
    searcher = {**_config()["searcher"], "name": "random", "max_trials": 1}
    hparams = {**_config()["hyperparameters"], "fail_once_at": 11}
    config = _folder(tmp_path, _config(searcher=searcher, hyperparameters=hparams, max_restarts=1))
    done = lb(*on_slurm(config, ws), cwd=tmp_path)
    assert done.returncode == 0, _shown(done)
    out = done.stdout + done.stderr
    assert "finished, 1 trials in all" in out, out[-4000:]
    started = [line for line in out.splitlines() if "bracket 0) " in line]  # submissions
    assert len(started) == 1 and ") starts:" in started[0], out[-4000:]
    _ends_as_uninterrupted(ws, local_weights, restarts=1)
    job = _job(ws)
    trial_dir = ws / "experiments/1/trials/1"
    assert [p.name for p in trial_dir.glob("slurm-*.out")] == [f"slurm-{job.job_id}.out"]
    output = pathlib.Path(job.output).read_text()
    assert output.count("deliberate failure at batch 11") >= 1, output[-3000:]
    said = f"The trial keeps its search trial: Slurm job {job.job_id} requeues itself after"
    assert said in output, output[-3000:]


@pytest.mark.slurm
def test_job_signalled_before_its_time_limit_requeues_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The launcher's default `--signal` (SIGUSR1, 120 s before the limit): once the trial
    trains, its job's limit is brought within those 120 s, as if it had been submitted with a
    short `--time`; Slurm signals it at its next time-limit check (every 30 s), the trial
    checkpoints at its batch and the job requeues itself. The requeued job is given time
    again (a job keeps its limit across requeues), and continues from that checkpoint."""
    ws = tmp_path / "ws"
    config = _folder(tmp_path, _config(slurm={"sbatch_args": ["--time=10"]}))
    # Held after its 2nd batch until the signal comes (Slurm checks limits every 30 s).
    gate = sf.Gate.at(tmp_path / "gate")
    coordinator = lb_start(*on_slurm(config, ws, *gate.options(2)), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _seen(ws))
        job_id = _job(ws).job_id
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=2")
        requeued = lambda: slurm_cluster.job(job_id).get("Restarts") == "1"  # noqa: E731
        _wait_for(requeued, 120, "the job to requeue itself")
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=10")
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    _ends_as_uninterrupted(ws, local_weights, restarts=1)
    output = pathlib.Path(_job(ws).output).read_text()
    assert "its time limit is near: the trial checkpointed" in output, output[-3000:]


def _parent(pid: int) -> int:
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[-1].split()[1])


@pytest.mark.slurm
def test_job_of_a_lost_node_is_requeued_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
) -> None:
    """The node of a running trial is lost: its slurmd and the job's processes are killed at
    once (as the machine going down kills them), Slurm is told the node is down. Slurm requeues
    the job; when the node is back it runs again and continues from the trial's latest durable
    checkpoint (the batches after it are trained again, as they were the first time). The
    trial runs on the spare partition, the node no other test uses."""
    ws = tmp_path / "ws"
    config = _folder(tmp_path, _config(resources={"resource_pool": "spare"}))
    gate = sf.Gate.at(tmp_path / "gate")
    coordinator = lb_start(*on_slurm(config, ws, *gate.options(7)), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _seen(ws))
        trial = _trial(ws)
        assert trial.pid is not None
        step = _parent(trial.pid)  # the job's slurmstepd
        slurm_cluster.kill_node("n3")
        for pid in (step, trial.pid):
            os.kill(pid, signal.SIGKILL)
        gate.release()  # the requeued job trains its batches after the checkpoint again
        slurm_cluster.run("scontrol", "update", "NodeName=n3", "State=DOWN", "Reason=lost")
        job_id = _job(ws).job_id
        pending = lambda: slurm_cluster.job(job_id).get("JobState") == "PENDING"  # noqa: E731
        _wait_for(pending, 60, "Slurm to requeue the job")
        slurm_cluster.start_node("n3")
        slurm_cluster.run("scontrol", "update", "NodeName=n3", "State=RESUME", check=False)
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    _ends_as_uninterrupted(ws, local_weights, restarts=1)


@pytest.mark.slurm
def test_crashing_job_is_restarted_then_recorded_error(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster
) -> None:
    hparams = {**_config()["hyperparameters"], "fail": "init"}
    ws = tmp_path / "ws"
    done = lb(
        *on_slurm(_folder(tmp_path, _config(hyperparameters=hparams, max_restarts=1)), ws),
        cwd=tmp_path,
    )
    assert done.returncode == 1, _shown(done)
    job = _job(ws)
    assert job.restarts == 1  # max_restarts: 1
    trial = _trial(ws)
    assert trial.state == "ERROR" and "deliberate failure in __init__" in trial.message
    output = pathlib.Path(job.output).read_text()
    assert output.count("deliberate failure in __init__") >= 2  # both runs' tracebacks


def _paused_once(
    ready: Callable[[], bool],
    what: str,
    args: list[str],
    cwd: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Start `lightning-bridge ARGS` on experiment 1; once `ready()` (`what`), `experiment
    pause 1`, which says its trials checkpoint and stop. The command's output, once it ended
    with 0."""
    ws = args[args.index("--workspace") + 1]
    coordinator = lb_start(*args, cwd=cwd)
    try:
        _wait_for(ready, 180, what)
        assert main(["experiment", "pause", "1", "--workspace", ws]) == 0
        assert "checkpoints and stops" in capsys.readouterr().out
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    return out


@pytest.mark.slurm
def test_paused_twice_then_continued_to_the_same_weights(
    tmp_path: pathlib.Path,
    slurm_cluster: SlurmCluster,
    local_weights: dict[str, torch.Tensor],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Paused by a signal to the coordinator (Ctrl-C / SIGTERM), continued; paused by
    `experiment pause`, continued to the end: the uninterrupted run's weights."""
    ws = tmp_path / "ws"
    config = _folder(tmp_path, _config())
    gate = sf.Gate.at(tmp_path / "gate")
    coordinator = lb_start(*on_slurm(config, ws, *gate.options([4, 12])), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _seen(ws))  # held after 4 batches
        coordinator.send_signal(signal.SIGTERM)
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out[-4000:]
    assert "Pausing Slurm job" in out
    first = _trial(ws)
    assert first.state == "STOPPED" and 4 <= first.batches_trained < 24, first

    resume = ["experiment", "continue", "1", "--workspace", str(ws)]
    out = _paused_once(
        lambda: gate.reached() == 2,  # held again after 12 batches
        "the trial to go on to its second hold",
        resume,
        tmp_path,
        capsys,
    )
    assert "Slurm job" in out  # continued through the recorded launcher
    second = _trial(ws)
    assert second.state == "STOPPED" and first.batches_trained < second.batches_trained < 24

    done = lb(*resume, cwd=tmp_path)
    assert done.returncode == 0, _shown(done)
    _ends_as_uninterrupted(ws, local_weights, restarts=0, runs=3)  # a job per run


@pytest.mark.slurm
def test_experiment_kill_cancels_the_job(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / "ws"
    config = _folder(tmp_path, _config())
    gate = sf.Gate.at(tmp_path / "gate")
    coordinator = lb_start(*on_slurm(config, ws, *gate.options(1)), cwd=tmp_path)
    try:
        gate.wait(seen=lambda: _seen(ws))
        assert main(["experiment", "kill", "1", "--workspace", str(ws)]) == 0
        assert "killed" in capsys.readouterr().out
    finally:
        finish(coordinator)
    job = _job(ws)
    killed = _trial(ws)
    assert killed.state == "STOPPED" and "killed" in killed.message, killed
    assert killed.batches_trained < 24 and job.state == "CANCELLED", job
    _wait_for(lambda: job.job_id not in slurm_cluster.jobs(), 30, "squeue to list no job")


@pytest.mark.slurm
def test_pausing_a_pending_job_cancels_it_and_records_the_trial_paused(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job Slurm has not started (held here: `--hold`) has no trial to checkpoint: pausing
    cancels it and records the trial paused, and its coordinator ends as paused."""
    ws = tmp_path / "ws"
    config = _folder(tmp_path, _config(slurm={"sbatch_args": ["--hold"]}))
    coordinator = lb_start(*on_slurm(config, ws), cwd=tmp_path)
    try:

        def submitted() -> bool:
            return Workspace(ws).registry_path.exists() and _job(ws) is not None

        _wait_for(submitted, 120, "the job's submission")
        job = _job(ws)
        assert main(["experiment", "pause", "1", "--workspace", str(ws)]) == 0
        assert f"Slurm job {job.job_id}, pending: cancelled" in capsys.readouterr().out
    finally:
        out = finish(coordinator)
    assert coordinator.returncode == 0, out
    paused = _trial(ws)
    assert paused.state == "STOPPED" and paused.batches_trained == 0, paused
    assert paused.message == f"paused while its Slurm job {job.job_id} was pending"
    _wait_for(lambda: job.job_id not in slurm_cluster.jobs(), 30, "squeue to list no job")


def _search_trials(workspace: pathlib.Path) -> list[Any]:
    if not Workspace(workspace).registry_path.exists():
        return []
    try:
        with Registry(workspace) as registry:
            return registry.trials()
    except Exception:  # noqa: BLE001 - the registry being created
        return []


@pytest.mark.slurm
def test_adaptive_asha_search_of_jobs_paused_and_continued(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """An adaptive_asha search whose trials are jobs, paused with `experiment pause` while
    its first trials train (they checkpoint and stop; the coordinator starts no other and
    ends), continued with `experiment continue`: the paused trials go on from their
    checkpoints, ASHA stops some at a rung, the best checkpoint is listed."""
    gate = sf.Gate.at(tmp_path / "gate")
    config = copy.deepcopy(sf.ASHA_CONFIG)
    config["hyperparameters"].update(gate.hparams(1))
    path = sf.write_folder(tmp_path, config, "exp", sf.TINY)
    ws = tmp_path / "ws"
    out = _paused_once(
        lambda: gate.reached() >= 1,
        "a trial held after its first batch",
        on_slurm(path, ws),
        tmp_path,
        capsys,
    )
    assert "The search stopped" in out, out[-4000:]
    paused = _search_trials(ws)
    assert paused and not any(t.state == "ACTIVE" for t in paused), paused
    assert any(0 < t.batches_trained < 16 for t in paused), paused
    assert not slurm_cluster.jobs(under=tmp_path)

    gate.release()  # the trials the search starts next train through
    done = lb("experiment", "continue", "1", "--workspace", str(ws), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, _shown(done)
    with Registry(ws) as registry:
        trials = registry.trials(1)
        jobs = {j.trial_id: j for j in registry.jobs(1)}
        best = registry.best_checkpoints(1, 1)
    assert len(trials) == 4 and set(jobs) == {t.id for t in trials}  # the paused ones went on
    assert all(j.state == "COMPLETED" for j in jobs.values()), jobs
    assert all(t.state == "COMPLETED" for t in trials), trials
    stopped = {t.id for t in paused if t.state == "STOPPED"}
    assert stopped and all(t.runs == 2 for t in trials if t.id in stopped), trials
    lengths = sorted(t.batches_trained for t in trials)
    assert lengths[-1] == 16 and lengths[0] < 16, lengths  # stopped at a rung
    assert best and best[0].uuid in done.stdout  # the summary lists the best checkpoint


@pytest.mark.slurm
@pytest.mark.postgres
def test_a_record_the_nodes_cannot_reach_stops_a_search_at_its_first_job(
    tmp_path: pathlib.Path, slurm_cluster: SlurmCluster, postgres: Any
) -> None:
    """The record is a PostgreSQL server found through libpq's PGHOST / PGPORT: the submitting
    machine's reach it, the jobs' (`--export` in sbatch_args) name a closed port. The first job
    ends before training naming the record; the search submits no other trial and fails with
    that message."""
    import socket

    name = postgres.new_database().rsplit("/", 1)[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    url = f"postgresql://postgres@/{name}"
    (ws / "workspace.json").write_text(json.dumps({"record": url}))
    searcher = {"name": "random", "metric": "validation_loss", "max_trials": 3}
    searcher.update(max_concurrent_trials=1, max_length={"batches": 8})
    slurm = {"sbatch_args": [f"--export=ALL,PGPORT={closed}"]}
    config = _folder(tmp_path, _config(slurm=slurm, searcher=searcher))
    server = {"PGHOST": "127.0.0.1", "PGPORT": str(postgres.port)}
    done = lb(*on_slurm(config, ws), cwd=tmp_path, timeout=300, env=server)
    assert done.returncode == 1, _shown(done)
    said = f"lightning-bridge: error: unreachable from node {socket.gethostname()}: "
    assert said + f"the experiment record {url}" in done.stderr
    os.environ.update(server)
    try:
        with Registry(ws) as registry:
            trials, job = registry.trials(), registry.job(1)
    finally:
        for key in server:
            del os.environ[key]
    (trial,) = trials  # no second trial submitted
    assert trial.state == "ERROR" and f"the experiment record {url}" in trial.message
    assert trial.batches_trained == 0 and job is not None and job.state == "FAILED"
