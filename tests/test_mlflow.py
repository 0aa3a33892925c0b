"""The record mirrored into a real MLflow tracking server, and `lightning-bridge model` on its
registry: runs, params, metrics, states, checkpoints and registered versions as MLflow's own
client reads them; a server stopped mid-run (the trial finishes, `experiment sync` completes
the record); MLflow's web UI in a headless Chromium. `mlflow_server` (tests/_mlflow_server.py)
starts `mlflow server` once for the module, on SQLite and a temporary artifact folder."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import pytest
import torch

import lightning_bridge as pytorch
from lightning_bridge.record._registry import Registry
from lightning_bridge.record._schema import TrialState
from tests import _folders
from tests._folders import BASE_CONFIG, checkpoint_weights, write_folder
from tests._mlflow_server import MlflowServer, logged_in_proxy, mlflow_server

__all__ = ["mlflow_server"]  # the fixture, used by name

# The server's tests skip (through the fixture) without MLflow's server, the embedded store's
# without its client; the missing extra's message is checked everywhere.
pytestmark = pytest.mark.mlflow
needs_client = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="needs MLflow's client: pip install mlflow"
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "determined_checkpoints"
# Where the UI test keeps its screenshots (the mlflow nox session sets it).
ARTIFACTS = pathlib.Path(
    os.environ.get("LIGHTNING_BRIDGE_TEST_ARTIFACTS")
    or pathlib.Path(tempfile.gettempdir()) / "lightning-bridge-test-artifacts"
)


class Unsafe:
    """A custom object: outside the weights-only safe set."""


def bridge(
    *args: str, workspace: pathlib.Path, uri: str, cwd: pathlib.Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = _folders.cli_env()
    env.update(LIGHTNING_BRIDGE_WORKSPACE=str(workspace), MLFLOW_TRACKING_URI=uri)
    done = subprocess.run(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@dataclasses.dataclass
class Answer:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, workspace: pathlib.Path, uri: str, check: bool = True) -> Answer:
    """A record or model command, in this process (MLflow's client is imported once)."""
    from lightning_bridge.experiment.cli._main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--workspace", str(workspace), "--tracking-uri", uri])
    answer = Answer(code, out.getvalue(), err.getvalue())
    if check:
        assert code == 0, answer
    return answer


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_of(uri: str, workspace: pathlib.Path, experiment_id: int) -> Any:
    key = f"{workspace.resolve()}#{experiment_id}"
    found = client(uri).search_experiments(filter_string=f"tags.`lightning_bridge.key` = '{key}'")
    assert len(found) == 1, found
    return found[0]


def runs_of(uri: str, mlflow_experiment: Any) -> dict[str, Any]:
    """The experiment's runs by their trial id ("search" for a search's parent run)."""
    runs = client(uri).search_runs([mlflow_experiment.experiment_id])
    return {
        r.data.tags.get("lightning_bridge.trial_id") or r.data.tags["lightning_bridge.role"]: r
        for r in runs
    }


def history(uri: str, run: Any, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client(uri).get_metric_history(run.info.run_id, key)]


def same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same reports: the same batches, the same values."""
    return [b for b, _ in got] == [b for b, _ in want] and [v for _, v in got] == pytest.approx(
        [v for _, v in want]
    )


def recorded(
    workspace: pathlib.Path, trial_id: int, kind: str, key: str
) -> list[tuple[int, float]]:
    with Registry(workspace) as registry:
        return [(m.batches, float(m.values[key])) for m in registry.metrics(trial_id, kind)]


# A secret of the mirrored run's config: never in MLflow.
TOKEN = f"s{uuid.uuid4().hex}"


@dataclasses.dataclass
class Registered:
    """A run mirrored into the server, its best checkpoint registered as `linear` version 1
    (alias champion)."""

    uri: str
    workspace: pathlib.Path
    folder: pathlib.Path
    run: subprocess.CompletedProcess[str]
    version: dict[str, Any]


@pytest.fixture(scope="module")
def registered(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> Registered:
    tmp_path = tmp_path_factory.mktemp("registered")
    uri, ws = mlflow_server.uri, tmp_path / "ws"
    environment = {"environment_variables": [f"HF_TOKEN={TOKEN}"]}
    config = write_folder(tmp_path, dict(BASE_CONFIG, environment=environment))
    run = bridge("run", str(config), workspace=ws, uri=uri, cwd=config.parent)
    with Registry(ws) as registry:
        best = registry.best_checkpoints(1)[0]
    cli("model", "create", "linear", workspace=ws, uri=uri)
    out = cli(
        "model", "register-version", "linear", best.uuid, "--alias", "champion", "--json",
        workspace=ws, uri=uri,
    ).stdout  # fmt: skip
    return Registered(uri, ws, tmp_path, run, json.loads(out))


def test_a_run_is_mirrored_and_its_checkpoint_registered(
    registered: Registered, mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    uri, ws, run = registered.uri, registered.workspace, registered.run
    assert f"MLflow: {uri}" in run.stdout

    experiment = experiment_of(uri, ws, 1)
    assert experiment.name == "linear [1]"
    link = json.loads((ws / "experiments" / "1" / "mlflow.json").read_text())
    assert link["mlflow_experiment_id"] == experiment.experiment_id
    (trial_run,) = runs_of(uri, experiment).values()
    assert trial_run.info.status == "FINISHED"
    assert trial_run.data.params == {"global_batch_size": "8", "lr": "0.05"}
    tags = trial_run.data.tags
    assert (
        tags["lightning_bridge.trial_id"] == "1" and tags["lightning_bridge.state"] == "COMPLETED"
    )
    assert tags["lightning_bridge.searcher"] == "single"
    with Registry(ws) as registry:
        assert tags["lightning_bridge.seed"] == str(registry.trial(1).seed)
        best = registry.best_checkpoints(1)[0]
    # Every report at its batch, under the record's names.
    validation = recorded(ws, 1, "validation", "validation_loss")
    assert [b for b, _ in validation] == [4, 8, 12, 16]
    assert same(history(uri, trial_run, "validation_loss"), validation)
    assert same(history(uri, trial_run, "loss"), recorded(ws, 1, "training", "loss"))
    artifacts = {a.path for a in client(uri).list_artifacts(trial_run.info.run_id)}
    assert {"config.json", "trial.log", "checkpoints"} <= artifacts
    shown = client(uri).download_artifacts(trial_run.info.run_id, "config.json", str(tmp_path))
    config = json.loads(pathlib.Path(shown).read_text())
    assert config["environment"]["environment_variables"] == ["HF_TOKEN=***"]
    stored = [p for p in mlflow_server.root.rglob("*") if p.is_file()]
    assert stored and not [p for p in stored if TOKEN.encode() in p.read_bytes()]

    # sync is idempotent: nothing is sent twice.
    cli("experiment", "sync", "1", workspace=ws, uri=uri)
    assert same(history(uri, trial_run, "validation_loss"), validation)

    # The registry, in Determined's habits.
    version = registered.version
    assert version["version"] == "1" and version["aliases"] == ["champion"]
    assert version["run_id"] == trial_run.info.run_id
    assert version["tags"]["lightning_bridge.checkpoint_uuid"] == best.uuid
    listed = json.loads(cli("model", "list", "--json", workspace=ws, uri=uri).stdout)
    assert [(m["name"], m["aliases"]) for m in listed] == [("linear", {"champion": "1"})]
    shown = cli("model", "list-versions", "linear", workspace=ws, uri=uri).stdout
    assert best.uuid in shown and "champion" in shown
    described = json.loads(
        cli("model", "describe", "linear", "--json", workspace=ws, uri=uri).stdout
    )
    assert [v["version"] for v in described["versions"]] == ["1"]

    # The way back: the version's checkpoint, byte for byte the trial's.
    out_dir = tmp_path / "champion"
    cli(
        "checkpoint", "download", "models:/linear@champion", "--out", str(out_dir),
        workspace=ws, uri=uri,
    )  # fmt: skip
    kept = pathlib.Path(best.location)
    for key, value in checkpoint_weights(kept).items():
        assert torch.equal(checkpoint_weights(out_dir)[key], value)

    # A Determined checkpoint copied from a cluster: checked, registered, loaded back.
    foreign = tmp_path / "from-cluster"
    shutil.copytree(FIXTURES / "0.38.1", foreign)
    cli("model", "create", "tiny", workspace=ws, uri=uri)
    cli("model", "register-version", "tiny", str(foreign), workspace=ws, uri=uri)
    back = tmp_path / "tiny-1"
    cli(
        "checkpoint", "download", "models:/tiny/1", "--out", str(back),
        workspace=ws, uri=uri,
    )  # fmt: skip
    trial = pytorch.load_trial_from_checkpoint_path(back)
    saved = torch.load(FIXTURES / "0.38.1" / "state_dict.pth", weights_only=False)
    for key, value in saved["models_state_dict"][0].items():
        assert torch.equal(trial.model.state_dict()[key], value)
    sys.modules.pop("model_def", None)

    # One the safe loader refuses is not registered.
    unsafe = tmp_path / "unsafe"
    shutil.copytree(FIXTURES / "0.38.1", unsafe)
    payload = torch.load(unsafe / "state_dict.pth", weights_only=False)
    payload["callbacks"] = {"note": Unsafe()}
    torch.save(payload, unsafe / "state_dict.pth")
    refused = cli(
        "model", "register-version", "tiny", str(unsafe), workspace=ws, uri=uri,
        check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "Unsafe" in refused.stderr, refused.stderr
    versions = json.loads(
        cli("model", "list-versions", "tiny", "--json", workspace=ws, uri=uri).stdout
    )
    assert [v["version"] for v in versions] == ["1"]


# adaptive_asha, aggressive: one bracket, rungs at 4 and 8 batches, one trial at a time: a
# trial that reaches the first rung outside the top half of it is stopped there.
ASHA: dict[str, Any] = {
    **_folders.SEARCH_CONFIG,
    "searcher": {
        "name": "adaptive_asha", "metric": "validation_loss", "smaller_is_better": True,
        "max_trials": 3, "max_time": 8, "time_metric": "batches", "divisor": 2,
        "mode": "aggressive", "max_rungs": 2, "max_concurrent_trials": 1,
    },
    "min_validation_period": {"batches": 4},
}  # fmt: skip


def test_a_core_api_script_is_mirrored(mlflow_server: MlflowServer, tmp_path: pathlib.Path) -> None:
    """A Core API script under `lightning-bridge run`: what it reports through
    `core_context.train` reaches MLflow as it reaches the record."""
    from tests._core_api_runs import core_folder

    uri, ws = mlflow_server.uri, tmp_path / "ws"
    folder = core_folder(tmp_path)
    bridge("run", str(folder / "const.yaml"), workspace=ws, uri=uri, cwd=folder)
    (run,) = runs_of(uri, experiment_of(uri, ws, 1)).values()
    assert run.info.status == "FINISHED"
    assert [b for b, _ in history(uri, run, "val_loss")] == [4, 8, 12]
    assert same(history(uri, run, "val_loss"), recorded(ws, 1, "validation", "val_loss"))
    assert same(history(uri, run, "loss"), recorded(ws, 1, "training", "loss"))

    # Its checkpoint (the script's own files) registered as a model version and fetched back.
    with Registry(ws) as registry:
        best = registry.best_checkpoints(1)[0]
    cli("model", "create", "core", workspace=ws, uri=uri)
    out = cli("model", "register-version", "core", best.uuid, "--json", workspace=ws, uri=uri)
    version = json.loads(out.stdout)
    assert version["run_id"] == run.info.run_id
    assert version["tags"]["lightning_bridge.checkpoint_uuid"] == best.uuid
    back = tmp_path / "core-1"
    cli("checkpoint", "download", "models:/core/1", "--out", str(back), workspace=ws, uri=uri)
    kept = pathlib.Path(best.location)
    assert sorted(p.name for p in back.iterdir()) == ["metadata.json", "shard.0", "state.pt"]
    for name in ("metadata.json", "state.pt"):
        assert (back / name).read_bytes() == (kept / name).read_bytes()


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="needs Hugging Face transformers: the [transformers] extra (the mlflow session has it)",
)
def test_a_hugging_face_trainer_run_is_mirrored(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    """A `transformers.Trainer` script with `DetCallback` under `lightning-bridge run`: the
    Trainer's `train_` / `eval_` logs reach the MLflow run at their steps, and the checkpoint
    folders the Trainer saved reach its artifacts, file for file."""
    from tests._hf_runs import hf_folder

    uri, ws = mlflow_server.uri, tmp_path / "ws"
    folder = hf_folder(tmp_path, checkpoint_storage={"save_trial_latest": 1, "save_trial_best": 0})
    bridge("run", str(folder / "const.yaml"), workspace=ws, uri=uri, cwd=folder)
    (run,) = runs_of(uri, experiment_of(uri, ws, 1)).values()
    assert run.info.status == "FINISHED"
    assert run.data.params == {"learning_rate": "0.01"}
    # The Trainer logs and evaluates every 4 of its 12 steps.
    assert [b for b, _ in history(uri, run, "eval_loss")] == [4, 8, 12]
    assert same(history(uri, run, "eval_loss"), recorded(ws, 1, "validation", "eval_loss"))
    for key in ("loss", "grad_norm", "learning_rate"):
        assert [b for b, _ in history(uri, run, key)] == [4, 8, 12], key
        assert same(history(uri, run, key), recorded(ws, 1, "training", key)), key
    assert history(uri, run, "learning_rate")[0][1] < 0.01  # the schedule's decay, as logged

    # The kept checkpoint, the Trainer's folder as stored, under the run's artifacts.
    with Registry(ws) as registry:
        (kept,) = registry.checkpoints(trial_id=1)
    assert kept.batches == 12
    tag = run.data.tags[f"lightning_bridge.checkpoint.{kept.uuid}"]
    assert tag == f"runs:/{run.info.run_id}/checkpoints/{kept.uuid}"
    back = pathlib.Path(
        client(uri).download_artifacts(
            run.info.run_id, f"checkpoints/{kept.uuid}", str(tmp_path / "back")
        )
    )
    stored = pathlib.Path(kept.location)
    files = sorted(str(p.relative_to(stored)) for p in stored.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file()) == files
    assert {"checkpoint-12/model.safetensors", "checkpoint-12/trainer_state.json"} <= set(files)
    for name in files:
        assert (back / name).read_bytes() == (stored / name).read_bytes(), name


@pytest.mark.search
def test_a_search_is_a_parent_run_with_its_trials_and_asha_stops(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    uri, ws = mlflow_server.uri, tmp_path / "ws"
    config = _folders.write_folder(tmp_path, ASHA, "exp", _folders.TINY)
    bridge("run", str(config), workspace=ws, uri=uri, cwd=tmp_path)
    runs = runs_of(uri, experiment_of(uri, ws, 1))
    parent = runs.pop("search")
    assert parent.data.tags["lightning_bridge.searcher"] == "adaptive_asha"
    assert parent.info.status == "FINISHED"
    with Registry(ws) as registry:
        trials = registry.trials(1)
    assert sorted(runs) == sorted(str(t.id) for t in trials) and len(trials) >= 2
    for trial in trials:
        run = runs[str(trial.id)]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        assert float(run.data.params["lr"]) == pytest.approx(trial.hparams["lr"])
        stopped = run.data.tags.get("lightning_bridge.searcher_stopped")
        assert (stopped is not None) == (trial.batches_trained < 8), (trial, stopped)
        want = recorded(ws, trial.id, "validation", "validation_loss")
        assert same(history(uri, run, "validation_loss"), want)
    assert any(t.batches_trained < 8 for t in trials)  # ASHA stopped one


@pytest.mark.processes
def test_a_server_stopped_mid_run_loses_nothing(
    mlflow_server: MlflowServer, tmp_path: pathlib.Path
) -> None:
    uri, ws = mlflow_server.uri, tmp_path / "ws"
    gate = _folders.Gate.at(tmp_path / "gate")  # the trial held after its first validation
    config = _folders.write_folder(
        tmp_path,
        {
            **_folders.SEARCH_CONFIG,
            "hyperparameters": {"global_batch_size": 8, "lr": 0.01, **gate.hparams(4)},
            "searcher": {"name": "single", "metric": "validation_loss",
                         "max_length": {"batches": 40}},
            "min_validation_period": {"batches": 4},
        },
        "exp",
        _folders.TINY,
    )  # fmt: skip
    env = _folders.cli_env()
    env.update(LIGHTNING_BRIDGE_WORKSPACE=str(ws), MLFLOW_TRACKING_URI=uri)
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "lightning_bridge", "run", str(config)],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            link = ws / "experiments" / "1" / "mlflow.json"
            if link.is_file() and json.loads(link.read_text()).get("runs"):
                run_id = json.loads(link.read_text())["runs"]["1"]
                if client(uri).get_run(run_id).data.metrics.get("validation_loss") is not None:
                    break
            time.sleep(0.5)
        assert process.poll() is None, log.read_text()[-3000:]
        gate.wait(seen=lambda: log.read_text()[-3000:])
        mlflow_server.stop()
        gate.release()
        started = time.monotonic()
        assert process.wait(300) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
        if mlflow_server._process is None:
            mlflow_server.start()
    output = log.read_text()
    assert "experiment sync 1" in output, output[-3000:]
    with Registry(ws) as registry:
        trial = registry.trial(1)
    assert trial.state == "COMPLETED" and trial.batches_trained == 40
    # The trial went on at its pace, not held up by the server it lost: its 36 batches after
    # the stop take seconds (a bound far above that, for a loaded machine).
    assert time.monotonic() - started < 120
    validation = recorded(ws, 1, "validation", "validation_loss")
    assert len(validation) == 10
    run = runs_of(uri, experiment_of(uri, ws, 1))["1"]
    assert len(history(uri, run, "validation_loss")) < 10  # the server missed some
    for _ in range(2):  # idempotent
        cli("experiment", "sync", "1", workspace=ws, uri=uri)
        run = runs_of(uri, experiment_of(uri, ws, 1))["1"]
        assert run.info.status == "FINISHED"
        assert same(history(uri, run, "validation_loss"), validation)


def test_the_web_ui_shows_the_runs_and_the_registered_model(registered: Registered) -> None:
    """MLflow's UI in a real headless browser (Debian's chromium): the experiment's page lists
    the trial's run, the models page the registered model; screenshots kept as artifacts."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("needs a headless browser: apt-get install chromium")
    experiment = experiment_of(registered.uri, registered.workspace, 1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = {
        "experiment": (f"#/experiments/{experiment.experiment_id}/runs", ["trial 1", "linear [1]"]),
        "models": ("#/models", ['href="#/models/linear"', "Version 1", "champion"]),
    }
    # The server asks for basic authentication: the browser reaches it through a proxy that
    # logs the user in (credentials in the page's URL would not reach the UI's API requests).
    username, password = (
        os.environ["MLFLOW_TRACKING_USERNAME"],
        os.environ["MLFLOW_TRACKING_PASSWORD"],
    )
    with logged_in_proxy(registered.uri, username, password) as proxy:
        for name, (route, expected) in pages.items():
            url = f"{proxy}/{route}"
            flags = [
                browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000", "--virtual-time-budget=30000",
            ]  # fmt: skip
            dom = subprocess.run(
                [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180
            ).stdout
            missing = [text for text in expected if text not in dom]
            assert not missing, f"{url} rendered without {missing}:\n{dom[-2000:]}"
            shot = ARTIFACTS / f"mlflow-ui-{name}.png"
            subprocess.run(
                [*flags, f"--screenshot={shot}", url], capture_output=True, timeout=180, check=True
            )
            assert shot.stat().st_size > 10_000, shot


def test_every_model_command_exits_as_the_console_script(
    registered: Registered, tmp_path: pathlib.Path
) -> None:
    """The registry's commands as the user runs them, each exiting after its work: MLflow's
    artifact download leaves its pool's threads behind, and `checkpoint download
    models:/NAME/VERSION` once waited on them forever after printing its line."""
    uri, ws = registered.uri, registered.workspace
    with Registry(ws) as registry:
        best = registry.best_checkpoints(1)[0]
    env = {**_folders.cli_env(), "LIGHTNING_BRIDGE_WORKSPACE": str(ws), "MLFLOW_TRACKING_URI": uri}

    def command(*args: str) -> str:
        try:
            done = subprocess.run(
                _folders.console_script(*args),
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"`lightning-bridge {' '.join(args)}` did not exit: "
                                 f"{exc.stdout!r} {exc.stderr!r}") from None  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    command("model", "create", "exits")
    version = json.loads(command("model", "register-version", "exits", best.uuid, "--json"))
    assert version["version"] == "1"
    command("model", "alias", "exits", "latest-good", "1")
    assert "exits" in command("model", "list")
    assert best.uuid in command("model", "list-versions", "exits")
    assert "latest-good" in command("model", "describe", "exits")
    command("experiment", "sync", "1")
    for source in ("models:/exits/1", "models:/exits@latest-good"):
        out = tmp_path / source.replace("/", "_").replace(":", "").replace("@", "_")
        assert "Downloaded version 1" in command(
            "checkpoint", "download", source, "--out", str(out)
        )
        for key, value in checkpoint_weights(pathlib.Path(best.location)).items():
            assert torch.equal(checkpoint_weights(out)[key], value)


# ----- without a server: the embedded store, the URI's resolution, the missing extra -----


def _recorded_experiment(ws: pathlib.Path) -> int:
    """An experiment recorded as a run records it: one trial, reports, a local checkpoint."""
    checkpoint = ws / "experiments" / "1" / "trials" / "1" / "checkpoints" / "ckpt-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata.json").write_text('{"steps_completed": 8}')
    with Registry(ws) as registry:
        experiment = registry.create_experiment(
            {"searcher": {"name": "single", "metric": "validation_loss"}}, name="embedded"
        )
        trial = registry.create_trial(experiment, hparams={"lr": 0.1, "opt": {"m": 0.9}}, seed=3)
        registry.trial_started(trial)
        for batches in (4, 8):
            registry.add_metrics(trial, "training", batches, 0, {"loss": 1.0 / batches})
            registry.add_metrics(trial, "validation", batches, 0, {"loss": 2.0 / batches})
        registry.add_checkpoint(
            "ckpt-1", trial, batches=8, epochs=0, location=str(checkpoint), metrics={}
        )
        registry.checkpoint_completed("ckpt-1")
        # One in remote storage: referenced where it is, not copied.
        registry.add_checkpoint(
            "ckpt-2", trial, batches=4, epochs=0, location="s3://bucket/exp/ckpt-2", metrics={}
        )
        registry.checkpoint_completed("ckpt-2")
        registry.trial_ended(trial, TrialState.STOPPED, "stopped by SIGTERM")
    return experiment


@needs_client
def test_the_embedded_store_gets_the_record_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_bridge.tracking._sync import sync_after_run

    ws = tmp_path / "ws"
    experiment_id = _recorded_experiment(ws)
    monkeypatch.delenv("LIGHTNING_BRIDGE_MLFLOW")
    with Registry(ws) as registry:
        line = sync_after_run(registry, experiment_id)
        assert line is not None and line.startswith(
            f"MLflow: mlflow ui --backend-store-uri sqlite:///{ws / 'mlflow.db'}"
        )
        sync_after_run(registry, experiment_id)  # twice: nothing sent twice
    uri = f"sqlite:///{ws / 'mlflow.db'}"
    (run,) = runs_of(uri, experiment_of(uri, ws, experiment_id)).values()
    assert run.info.status == "KILLED"  # STOPPED
    assert run.data.params == {"lr": "0.1", "opt.m": "0.9"}
    assert run.data.tags["lightning_bridge.message"] == "stopped by SIGTERM"
    assert history(uri, run, "loss") == [(4, 0.25), (8, 0.125)]
    assert history(uri, run, "validation_loss") == [(4, 0.5), (8, 0.25)]
    stored = ws / "mlartifacts" / str(experiment_id)
    assert list(stored.rglob("checkpoints/ckpt-1/metadata.json"))
    assert run.data.tags["lightning_bridge.checkpoint.ckpt-1"].endswith("/checkpoints/ckpt-1")
    assert run.data.tags["lightning_bridge.checkpoint.ckpt-2"] == "s3://bucket/exp/ckpt-2"
    assert not list(stored.rglob("ckpt-2"))


@needs_client
def test_the_tracking_uri_is_the_option_then_the_environment_then_the_workspace(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_bridge.tracking._settings import tracking_uri

    ws = tmp_path
    assert tracking_uri(ws) is None  # the tests turn the embedded default off
    monkeypatch.delenv("LIGHTNING_BRIDGE_MLFLOW")
    assert tracking_uri(ws) == f"sqlite:///{ws / 'mlflow.db'}"
    (ws / "mlflow.json").write_text('{"tracking_uri": "http://team:5000"}')
    assert tracking_uri(ws) == "http://team:5000"
    (ws / "workspace.json").write_text('{"tracking_uri": "http://settings:5000"}')
    assert tracking_uri(ws) == "http://settings:5000"  # the workspace's settings file first
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking_uri(ws) == "http://env:5000"
    assert tracking_uri(ws, "http://given:5000") == "http://given:5000"
    assert tracking_uri(ws, "off") is None


def test_without_mlflow_the_commands_name_the_extra(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    for command in (("model", "list"), ("experiment", "sync", "1")):
        answer = cli(*command, workspace=tmp_path / "ws", uri="http://x:1", check=False)
        assert answer.returncode == 2
        assert "pip install 'lightning-bridge[mlflow]'" in answer.stderr, answer


@needs_client
@pytest.mark.postgres
def test_machines_sharing_a_record_mirror_into_one_experiment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, postgres: Any
) -> None:
    """A search's workers on other machines write the same record on a PostgreSQL server: each
    machine's sync finds the experiment's MLflow experiment and trial runs by the record, not by
    its own workspace folder, so the team sees one experiment and nothing twice."""
    from lightning_bridge.tracking._mirror import Mirror

    monkeypatch.chdir(tmp_path)  # where MLflow's SQLite store puts the artifacts
    record = postgres.new_database()
    machines = [tmp_path / "machine-a", tmp_path / "machine-b"]
    for ws in machines:
        ws.mkdir()
        (ws / "workspace.json").write_text(json.dumps({"record": record}))
    experiment_id = _recorded_experiment(machines[0])
    uri = f"sqlite:///{tmp_path / 'team-mlflow.db'}"
    for ws in [*machines, machines[0]]:
        with Registry(ws) as registry:
            Mirror(registry, uri).sync_experiment(experiment_id)
    found = client(uri).search_experiments()
    (experiment,) = [e for e in found if "lightning_bridge.key" in e.tags]
    assert experiment.name == "embedded [1]"
    assert experiment.tags["lightning_bridge.key"].endswith(f"#{experiment_id}")
    (run,) = client(uri).search_runs([experiment.experiment_id])
    assert run.data.tags["lightning_bridge.trial_id"] == "1"
    assert history(uri, run, "loss") == [(4, 0.25), (8, 0.125)]
    assert history(uri, run, "validation_loss") == [(4, 0.5), (8, 0.25)]


def _open_store_at_once(ws: str, uri: str, barrier: Any, errors: Any) -> None:
    import mlflow  # noqa: F401 - imported before the barrier: the processes meet at the store

    from lightning_bridge.tracking._mirror import Mirror

    with Registry(pathlib.Path(ws)) as registry:
        barrier.wait(120)
        try:
            Mirror(registry, uri).client.search_experiments()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.put(f"{type(exc).__name__}: {exc}")


@needs_client
def test_trials_opening_a_new_sqlite_store_at_once_all_get_it(tmp_path: pathlib.Path) -> None:
    """The trials of a search start together and each opens the workspace's MLflow store: the
    first creates MLflow's tables while the others wait, instead of all migrating one file."""
    import multiprocessing

    ws = tmp_path / "ws"
    Registry(ws).close()
    uri = f"sqlite:///{ws / 'mlflow.db'}"
    context = multiprocessing.get_context("spawn")
    barrier, errors = context.Barrier(3), context.Queue()
    processes = [
        context.Process(target=_open_store_at_once, args=(str(ws), uri, barrier, errors))
        for _ in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(300)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found
    assert [p.exitcode for p in processes] == [0, 0, 0]
    assert client(uri).search_experiments()  # MLflow's Default experiment: the store is whole


# Creates the store at argv[1]; held after its 5th migration step (it writes argv[2] there
# and waits to be killed), so that the test kills it in the middle of the migrations.
CREATE_STORE = """
import pathlib
import sys
import time

import mlflow
from alembic.runtime.migration import HeadMaintainer
from lightning_bridge.tracking._mirror import open_client

update_to_step = HeadMaintainer.update_to_step
steps = []


def held_midway(self, step):
    update_to_step(self, step)
    steps.append(step)
    if len(steps) == 5:
        pathlib.Path(sys.argv[2]).touch()
        time.sleep(600)


HeadMaintainer.update_to_step = held_midway
print("importing done", flush=True)
open_client(sys.argv[1]).search_experiments()
"""


@needs_client
def test_a_process_killed_while_creating_the_sqlite_store_leaves_none_half_made(
    tmp_path: pathlib.Path,
) -> None:
    """MLflow migrates a new store in dozens of steps; a trial that ends (or is killed) during
    them must not leave a store no later run can open."""
    from lightning_bridge.tracking._mirror import open_client

    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    building = tmp_path / ".mlflow.db.new"
    script = tmp_path / "create.py"
    script.write_text(CREATE_STORE)
    midway = tmp_path / "midway"
    command = [sys.executable, str(script), uri, str(midway)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline().strip() == b"importing done"
    _folders.wait_for(midway, process, 120, "the store's 5th migration step")
    assert building.exists(), sorted(p.name for p in tmp_path.iterdir())
    process.kill()
    process.wait()
    assert not store.exists(), "a store was left under its name before it was complete"
    # The next run creates it whole and uses it.
    client = open_client(uri)
    experiment = client.create_experiment("after the kill")
    assert client.get_experiment(experiment).name == "after the kill"
    assert store.exists() and not building.exists()
