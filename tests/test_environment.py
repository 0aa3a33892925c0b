"""The config's `environment.environment_variables` in the trial's processes: both of
Determined's forms, Determined's order of precedence (the shell, then the config, then the
startup hook, then the launcher's per-process variables), every process of the trial (a
script's ranks under torchrun, a trial class, a search's warm-forked trials), and the one
message a malformed entry gets before anything is recorded."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
from typing import Any

import pytest

from lightning_bridge._errors import InvalidArgumentError
from lightning_bridge._secrets import redact_config, redact_url
from lightning_bridge.experiment.config._config import parse_config
from tests._env_probes import HOOK, PROBE_PY, TRIAL_PROBE
from tests._folders import BASE_CONFIG, cli_env, command, write_folder

TOKEN = "hf_token-value-91c2"


def _config(entrypoint: str, variables: Any, **changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(BASE_CONFIG)
    config["entrypoint"] = entrypoint
    config["environment"] = {"environment_variables": variables, "image": "determinedai/x:1"}
    config.update(changes)
    return config


def _run(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(), "FROM_SHELL": "shell", "OVERRIDDEN": "shell"}
    return subprocess.run(
        command("run", "const.yaml", "--workspace", str(folder.parent / "ws"), *args),
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _seen(folder: pathlib.Path, name: str) -> dict[str, Any]:
    return json.loads((folder / f"env.{name}.json").read_text())


@pytest.mark.processes
def test_every_process_of_a_script_sees_the_configs_variables_in_determineds_order(
    tmp_path: pathlib.Path,
) -> None:
    variables = ["OVERRIDDEN=config", "DUP=1", "DUP=2", "WITH_EQ=a=b", "HOOKED=config"]
    variables.append(f"HF_TOKEN={TOKEN}")
    entrypoint = "python3 -m determined.launch.torch_distributed -- python3 probe.py"
    config = write_folder(
        tmp_path, _config(entrypoint, variables, resources={"slots_per_trial": 2})
    )
    folder = config.parent
    (folder / "probe.py").write_text(PROBE_PY)
    (folder / "startup-hook.sh").write_text(HOOK)
    result = _run(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in ("0", "1"):
        assert _seen(folder, rank) == {
            "FROM_SHELL": "shell",  # the shell's variables stay
            "OVERRIDDEN": "config",  # the config's come after the shell's
            "HOOKED": "config-hook",  # the startup hook runs after them and sees them
            "DUP": "from-hook",
            "WITH_EQ": "a=b",  # the value is everything after the first '='
            "DEVICE": None,
            "RANK": rank,  # the launcher's own, per process
            "HF_TOKEN": TOKEN,  # a secret reaches the trial's processes
        }
    # environment is applied, not warned about; its other keys still are.
    assert "environment.image" in result.stderr
    assert "environment.environment_variables" not in result.stderr
    # ... and nobody who reads the record: describe shows it masked, the others as given.
    ws = ["--workspace", str(tmp_path / "ws")]
    for extra in ([], ["--json"]):
        shown = subprocess.run(
            command("experiment", "describe", "1", *ws, *extra),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        assert TOKEN not in shown.stdout + shown.stderr
    config_shown = json.loads(shown.stdout)["config"]["environment"]["environment_variables"]
    assert "HF_TOKEN=***" in config_shown and "WITH_EQ=a=b" in config_shown


@pytest.mark.processes
def test_a_search_of_trial_classes_gets_the_variables_of_its_device_type(
    tmp_path: pathlib.Path,
) -> None:
    variables = {"cpu": ["DEVICE=cpu", "OVERRIDDEN=cpu"], "gpu": ["DEVICE=cuda"]}
    config = _config(
        "probe_def:ProbeTrial",
        variables,
        hyperparameters={
            "global_batch_size": 8,
            "lr": {"type": "categorical", "vals": [0.1, 0.2]},
            "out": str(tmp_path),
        },
    )
    config["searcher"] = {
        "name": "grid",
        "metric": "validation_loss",
        "max_length": {"batches": 2},
    }
    folder = write_folder(tmp_path, config).parent
    (folder / "probe_def.py").write_text(TRIAL_PROBE)
    result = _run(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    # Both trials (forks of the search's warm process) on this machine's CPU: cpu's list.
    for lr in ("0.1", "0.2"):
        assert _seen(tmp_path, f"{lr}.0") == {
            "FROM_SHELL": "shell",
            "OVERRIDDEN": "cpu",
            "HOOKED": None,
            "DEVICE": "cpu",
            "RANK": None,
        }


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        (["A=1", "HF_TOKEN"], "environment.environment_variables: [1]: expected NAME=VALUE"),
        (["=x"], "[0]: expected NAME=VALUE (a variable name, then '=' and its value); the entry"),
        ([3], "[0]: expected a string NAME=VALUE, got an integer"),
        ({"tpu": ["A=1"]}, "unknown device type 'tpu': expected cpu, cuda or rocm"),
        ({"cuda": "A=1"}, "cuda: expected a list of NAME=VALUE strings, got a string"),
        ("A=1", "expected a list of NAME=VALUE strings, or a mapping of cpu, cuda or rocm"),
        (["RANK=3"], "RANK is set by the launcher for each of the trial's processes"),
        (["LIGHTNING_BRIDGE_WORKSPACE=/x"], "LIGHTNING_BRIDGE_WORKSPACE is set by the launcher"),
    ],
)
def test_a_malformed_entry_is_one_config_error_naming_its_place(variables: Any, line: str) -> None:
    config = _config("model_def:LinearTrial", variables)
    with pytest.raises(InvalidArgumentError) as info:
        parse_config(config)
    message = str(info.value)
    assert line in message
    assert len(message.splitlines()) == 2  # the heading and one line
    # The entries' text (a value may be a secret) is not repeated.
    assert "HF_TOKEN" not in message and "A=1" not in message


@pytest.mark.processes
def test_a_malformed_entry_stops_the_run_before_anything_is_recorded(
    tmp_path: pathlib.Path,
) -> None:
    folder = write_folder(tmp_path, _config("model_def:LinearTrial", ["TOKEN:abc"])).parent
    result = _run(folder)
    assert result.returncode == 2
    assert "environment.environment_variables: [0]: expected NAME=VALUE" in result.stderr
    assert "abc" not in result.stdout + result.stderr
    assert not (tmp_path / "ws" / "experiments").exists()


def test_both_forms_mean_what_they_mean_on_determined() -> None:
    listed = parse_config(_config("model_def:LinearTrial", ["A=1", "B=2", "A=3"]))
    env = listed.model.environment
    assert [env.variables_for(k) for k in ("cpu", "cuda", "rocm")] == [{"A": "3", "B": "2"}] * 3
    mapped = parse_config(_config("model_def:LinearTrial", {"cpu": ["A=1"], "gpu": ["A=g"]}))
    env = mapped.model.environment
    assert [env.variables_for(k) for k in ("cpu", "cuda", "rocm")] == [{"A": "1"}, {"A": "g"}, {}]
    # `cuda` wins over Determined's older `gpu` spelling where both are given.
    both = parse_config(_config("model_def:LinearTrial", {"cuda": ["A=c"], "gpu": ["A=g"]}))
    assert both.model.environment.variables_for("cuda") == {"A": "c"}
    assert (
        parse_config(_config("model_def:LinearTrial", None)).model.environment.variables_for("cpu")
        == {}
    )


def test_one_definition_of_a_secret_masks_what_a_config_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LIGHTNING_BRIDGE_SECRET_NAMES", "wandb_*, MY_DSN")
    config = _config(
        "model_def:LinearTrial",
        {
            "cpu": ["HF_TOKEN=t1", "AWS_SECRET_ACCESS_KEY=t2", "db_password=t3", "HF_HOME=/hf"],
            "cuda": ["WANDB_ENTITY=t4", "MY_DSN=t5", "EMPTY_TOKEN=", "NCCL_DEBUG=INFO"],
        },
        checkpoint_storage={"type": "s3", "bucket": "b", "access_key": "t6", "secret_key": "t7"},
    )
    shown = redact_config(config)
    assert shown["environment"]["environment_variables"] == {
        "cpu": ["HF_TOKEN=***", "AWS_SECRET_ACCESS_KEY=***", "db_password=***", "HF_HOME=/hf"],
        "cuda": ["WANDB_ENTITY=***", "MY_DSN=***", "EMPTY_TOKEN=", "NCCL_DEBUG=INFO"],
    }
    storage = shown["checkpoint_storage"]
    assert (storage["access_key"], storage["secret_key"], storage["bucket"]) == ("***", "***", "b")
    assert config["checkpoint_storage"]["secret_key"] == "t7"  # the config itself is kept
    assert redact_url("postgresql://lb:pw@db:5432/x") == "postgresql://lb:***@db:5432/x"
    assert redact_url("postgresql://db/x") == "postgresql://db/x"
