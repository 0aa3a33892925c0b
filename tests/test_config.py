"""Experiment config validation, `--set`, entrypoint forms, the determined import mapping."""

from __future__ import annotations

import pathlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

import lightning_bridge
from lightning_bridge import InvalidArgumentError
from lightning_bridge.contract import _import_map
from lightning_bridge.experiment.cli._main import main
from lightning_bridge.experiment.config._config import load_config, parse_config
from lightning_bridge.experiment.config._entrypoint import Entrypoint, parse_entrypoint


def _error(config: Any, overrides: list[str] | None = None) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        parse_config(config, overrides)
    return str(info.value)


@pytest.mark.parametrize(
    ("config", "line"),
    [
        (
            {"searcher": {"max_length": {"epochs": -3}}},
            "searcher.max_length.epochs: expected a positive integer, got -3",
        ),
        (
            {"searcher": {"max_length": {"batches": 2, "epochs": 1}}},
            "searcher.max_length: expected exactly one of batches, records or epochs, got "
            "{batches: 2, epochs: 1}",
        ),
        (
            {"min_validation_period": {"batches": 1.5}},
            "min_validation_period.batches: expected an integer, got 1.5",
        ),
        (
            {"optimizations": {"aggregation_frequency": 0}},
            "optimizations.aggregation_frequency: expected an integer of at least 1, got 0",
        ),
        (
            {"resources": {"slots_per_trial": True}},
            "resources.slots_per_trial: expected an integer, got true",
        ),
        (
            {"checkpoint_policy": "some"},
            "checkpoint_policy: expected 'best', 'all' or 'none', got 'some'",
        ),
        (
            {"searcher": {"max_time": 10}},
            "searcher: max_time and time_metric go together",
        ),
        (
            {"hyperparamters": {"lr": 1}},
            "hyperparamters: unknown key (Determined's experiment config has no such key",
        ),
        (
            {"searcher": {"name": "adaptive_asha", "max_trials": 4}},
            "searcher.metric: required (the validation metric that ranks trials",
        ),
        (
            {"hyperparameters": {"opt": {"type": "adam", "lr": 1}}},
            "hyperparameters.opt.type: expected one of const, int, double, log, categorical",
        ),
        (
            {"hyperparameters": {"lr": {"type": "const"}}},
            "hyperparameters.lr.val: required",
        ),
        ({"entrypoint": 3}, "entrypoint: expected a string, got 3"),
    ],
)
def test_invalid_values_name_the_key(config: dict[str, Any], line: str) -> None:
    message = _error(config)
    assert message.startswith("invalid experiment config:")
    assert line in message


def test_every_problem_is_reported_at_once() -> None:
    message = _error(
        {"records_per_epoch": -1, "searcher": {"smaller_is_better": "yes"}, "typo_key": 1}
    )
    assert "records_per_epoch: expected a non-negative integer, got -1" in message
    assert "searcher.smaller_is_better: expected true or false, got 'yes'" in message
    assert "typo_key: unknown key" in message


def test_hyperparameter_forms() -> None:
    conf = parse_config(
        {
            "hyperparameters": {
                "global_batch_size": 32,
                "lr": {"type": "const", "val": 0.1},
                "layers": [64, 32],
                "optimizer": {"name": "sgd", "momentum": {"type": "const", "val": 0.9}},
            }
        }
    )
    assert conf.hparams == {
        "global_batch_size": 32,
        "lr": 0.1,
        "layers": [64, 32],
        "optimizer": {"name": "sgd", "momentum": 0.9},
    }
    # The single searcher samples ranges once (as Determined's does), from the experiment seed.
    for form, inside in (
        ({"type": "int", "minval": 1, "maxval": 4}, lambda v: v in (1, 2, 3, 4)),
        ({"type": "double", "minval": 0.1, "maxval": 0.5}, lambda v: 0.1 <= v <= 0.5),
        ({"type": "log", "base": 10, "minval": -4, "maxval": -1}, lambda v: 1e-4 <= v <= 0.1),
        ({"type": "categorical", "vals": [[1, 2], {"a": 1}]}, lambda v: v in ([1, 2], {"a": 1})),
    ):
        config = {"hyperparameters": {"group": {"x": form}}}
        sampled = parse_config(config, ["reproducibility.experiment_seed=7"]).hparams
        assert inside(sampled["group"]["x"]), (form, sampled)
        assert parse_config(config, ["reproducibility.experiment_seed=7"]).hparams == sampled
        fixed = parse_config(config, ["hyperparameters.group.x=3"])
        assert fixed.hparams == {"group": {"x": 3}}
    # A search of several trials has no one set of values; the runner says how to run one.
    search = parse_config(
        {"searcher": {"name": "random", "metric": "loss", "max_trials": 3}},
        ["hyperparameters.lr={type: double, minval: 0.1, maxval: 0.5}"],
    )
    with pytest.raises(InvalidArgumentError, match="--set searcher.name=single"):
        search.require_one_trial()


def test_set_overrides() -> None:
    conf = parse_config(
        {"searcher": {"metric": "loss", "max_length": {"epochs": 3}}},
        [
            "searcher.max_length={batches: 10}",
            "searcher.smaller_is_better=false",
            "data.path=/data/x",
            "hyperparameters.name=resnet",
        ],
    )
    assert str(conf.length("max_length")) == str(lightning_bridge.Batch(10))
    assert conf.model.searcher.smaller_is_better is False
    assert conf.experiment_config()["data"] == {"path": "/data/x"}
    assert conf.hparams == {"name": "resnet"}
    assert "--set 'lr': expected KEY.PATH=VALUE" in _error({}, ["lr"])
    assert "searcher is 3, not a mapping" in _error({"searcher": 3}, ["searcher.name=single"])


def test_lengths_and_periods() -> None:
    conf = parse_config(
        {
            "hyperparameters": {"global_batch_size": 16},
            "searcher": {"max_time": 100, "time_metric": "records"},
            "min_validation_period": {"epochs": 1},
            "min_checkpoint_period": {"batches": 0},
        }
    )
    assert str(conf.length("max_length")) == str(lightning_bridge.Batch(6))
    assert str(conf.length("min_validation_period")) == str(lightning_bridge.Epoch(1))
    assert conf.length("min_checkpoint_period").value == sys.maxsize  # type: ignore[union-attr]
    no_gbs = parse_config({"searcher": {"max_length": {"records": 100}}})
    with pytest.raises(InvalidArgumentError, match="needs the hyperparameter global_batch_size"):
        no_gbs.length("max_length")


def test_unused_keys_and_checkpoint_storage(tmp_path: pathlib.Path) -> None:
    conf = parse_config(
        {
            "name": "x",
            "description": "y",
            "max_restarts": 3,
            "environment": {"image": "img"},
            "resources": {"slots_per_trial": 1, "resource_pool": "gpu"},
            "searcher": {"max_concurrent_trials": 4, "source_trial_id": 4},
            "checkpoint_storage": {"type": "s3", "bucket": "b", "save_trial_best": 2},
        }
    )
    assert conf.unused_keys == [
        "environment.image",  # environment_variables is applied; images are not
        "max_restarts (a failed trial is not restarted: continue it with `lightning-bridge "
        "experiment continue ID`)",
        "resources.resource_pool",
        "searcher.max_concurrent_trials",  # searcher.source_trial_id is used (warm start)
    ]
    # The storage is kept as given (the run uploads to it), Determined's retention defaults
    # filled in; keys another storage type reads are reported.
    assert conf.experiment_config(tmp_path)["checkpoint_storage"] == {
        "type": "s3",
        "bucket": "b",
        "save_trial_best": 2,
        "save_trial_latest": 1,
        "save_experiment_best": 0,
    }
    shared = parse_config(
        {"checkpoint_storage": {"type": "shared_fs", "host_path": "ck", "bucket": "b"}}
    )
    assert shared.unused_keys == ["checkpoint_storage.bucket"]
    assert shared.experiment_config(tmp_path)["checkpoint_storage"]["host_path"] == str(
        tmp_path / "ck"
    )
    # No checkpoint_storage: Determined's defaults, checkpoints in the trial's folder.
    assert parse_config({}).experiment_config(tmp_path)["checkpoint_storage"] == {
        "save_experiment_best": 0,
        "save_trial_best": 1,
        "save_trial_latest": 1,
    }
    assert parse_config({"max_restarts": 0}).unused_keys == []


def test_checkpoint_storage_types_need_their_keys() -> None:
    cases = {
        "s3": "checkpoint_storage: type s3 needs bucket",
        "directory": "checkpoint_storage: type directory needs container_path",
        "azure": "checkpoint_storage: type azure needs container",
        "nfs": "checkpoint_storage.type: expected 'shared_fs', 'directory', 's3', 'gcs' or",
    }
    for kind, message in cases.items():
        with pytest.raises(InvalidArgumentError, match=message):
            parse_config({"checkpoint_storage": {"type": kind}})
    with pytest.raises(InvalidArgumentError, match="exactly one of connection_string or acc"):
        parse_config({"checkpoint_storage": {"type": "azure", "container": "c"}})


@pytest.mark.parametrize(
    ("storage", "line"),
    [
        (
            {"type": "azure", "container": "c", "connection_string": "s", "account_url": "u"},
            "type azure needs exactly one of connection_string or account_url",
        ),
        (
            {"type": "azure", "container": "c", "connection_string": "s", "credential": "k"},
            "credential and connection_string must not both be set",
        ),
        ({"type": "s3", "bucket": "b", "prefix": "runs/../x"}, "prefix cannot contain /../"),
        ({"type": "gcs", "bucket": "b", "prefix": ".."}, "prefix cannot contain /../"),
        ({"type": "s3", "bucket": "b", "prefix": "runs/.."}, "prefix cannot contain /../"),
        (
            {"type": "shared_fs", "host_path": "/data", "storage_path": "a/../../up"},
            "storage_path must either be a relative directory or a subdirectory of host_path",
        ),
        (
            {"type": "shared_fs", "host_path": "/data", "storage_path": "/elsewhere/ck"},
            "storage_path must either be a relative directory or a subdirectory of host_path",
        ),
    ],
)
def test_checkpoint_storage_paths_and_credentials(storage: dict[str, Any], line: str) -> None:
    """Determined refuses these storages (checkpoints outside their prefix or host_path,
    ambiguous Azure credentials); so does the bridge, naming the key."""
    assert f"checkpoint_storage: {line}" in _error({"checkpoint_storage": storage})


def test_checkpoint_storage_paths_inside_are_accepted() -> None:
    for storage in (
        {"type": "shared_fs", "host_path": "/data", "storage_path": "/data/ck"},
        {"type": "shared_fs", "host_path": "/data", "storage_path": "a/../ck"},
        {"type": "s3", "bucket": "b", "prefix": "runs/..x/y"},
        {"type": "azure", "container": "c", "account_url": "u", "credential": "k"},
    ):
        assert parse_config({"checkpoint_storage": storage}).model.checkpoint_storage


_ASHA = {"name": "adaptive_asha", "metric": "loss", "max_trials": 4}


def test_max_length_with_max_time_as_determined_reads_them() -> None:
    """A legacy trial class's ASHA config: max_length is the trial's length, max_time in
    time_metric the searcher's (its rungs), as in Determined 0.38."""
    conf = parse_config(
        {
            "searcher": {
                **_ASHA,
                "max_length": {"epochs": 2},
                "max_time": 400,
                "time_metric": "batches",
            }
        }
    )
    assert str(conf.length("max_length")) == str(lightning_bridge.Epoch(2))
    assert conf.model.searcher.length() == ("batches", 400)
    assert conf.determined_differences == []


def test_time_metric_is_any_validation_metric() -> None:
    conf = parse_config(
        {
            "searcher": {
                **_ASHA,
                "max_length": {"batches": 50},
                "max_time": 3200,
                "time_metric": "samples",
            }
        }
    )
    assert conf.model.searcher.length() == ("samples", 3200)
    assert str(conf.length("max_length")) == str(lightning_bridge.Batch(50))
    # Without max_length a metric of the trial's own is no training length: a script's
    # fit(max_length=...) gives it (a trial class is refused when the run is prepared).
    alone = parse_config({"searcher": {**_ASHA, "max_time": 3200, "time_metric": "samples"}})
    assert alone.length("max_length") is None
    # A unit of training as time_metric is also the trial's length when max_length is absent.
    timed = parse_config({"searcher": {**_ASHA, "max_time": 30, "time_metric": "epochs"}})
    assert str(timed.length("max_length")) == str(lightning_bridge.Epoch(30))
    assert "searcher.time_metric: expected a string, got 3" in _error(
        {"searcher": {**_ASHA, "max_time": 10, "time_metric": 3}}
    )


def test_unitless_max_length_is_accepted_without_a_length() -> None:
    """Determined takes `max_length: 10` (no unit); only a script's fit(max_length) can use it."""
    conf = parse_config({"searcher": {"name": "single", "metric": "loss", "max_length": 10}})
    assert conf.length("max_length") is None
    message = _error({"searcher": {"max_length": "ten"}})
    assert message.splitlines()[1:] == ["  searcher.max_length: expected a mapping, got 'ten'"]
    # ASHA needs a length with a unit to place its rungs.
    assert "needs max_time and time_metric" in _error({"searcher": {**_ASHA, "max_length": 10}})


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({}, "searcher: Determined requires a searcher section"),
        ({"searcher": {"name": "single"}}, "searcher.metric: Determined requires it"),
        (
            {"searcher": {**_ASHA, "max_length": {"batches": 90}}},
            "Determined 0.38 refuses the adaptive_asha searcher without max_time",
        ),
        (
            {"searcher": {"metric": "loss", "max_time": 9, "time_metric": "batches"}},
            "the single searcher of Determined has no such keys",
        ),
        (
            {
                "hyperparameters": {"global_batch_size": 4},
                "searcher": {**_ASHA, "max_time": 90, "time_metric": "records"},
            },
            "records is not a metric Determined's harness reports",
        ),
    ],
)
def test_what_determined_would_refuse_is_run_and_said(config: dict[str, Any], said: str) -> None:
    """Configs the bridge runs and Determined 0.38.1 refuses: one line each saying so."""
    lines = parse_config(config).determined_differences
    assert len(lines) == 1 and said in lines[0]


def test_load_config_file_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("searcher: [unclosed\n")
    with pytest.raises(InvalidArgumentError, match="is not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(InvalidArgumentError, match="must be a mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("model_def:MyTrial", Entrypoint(trial="model_def:MyTrial")),
        ("pkg.model:Outer.Trial", Entrypoint(trial="pkg.model:Outer.Trial")),
        (
            "python3 train.py --epochs 3",
            Entrypoint(command=["python3", "train.py", "--epochs", "3"], python=True),
        ),
        (
            ["python3", "-m", "pkg.train"],
            Entrypoint(command=["python3", "-m", "pkg.train"], python=True),
        ),
        (
            "python3 -m determined.launch.torch_distributed python3 train.py",
            Entrypoint(command=["python3", "train.py"], python=True, launched=True),
        ),
        (
            "python3 -m determined.launch.torch_distributed --max_restarts 1 -- python3 t.py",
            Entrypoint(command=["python3", "t.py"], python=True, launched=True),
        ),
        (
            "python3 -m determined.launch.torch_distributed --trial model_def:T",
            Entrypoint(trial="model_def:T"),
        ),
        ("bash run.sh", Entrypoint(command=["bash", "run.sh"], python=False)),
    ],
)
def test_entrypoint_forms(entrypoint: Any, expected: Entrypoint) -> None:
    assert parse_entrypoint(entrypoint) == expected


def test_unsupported_launchers_and_missing_entrypoint() -> None:
    # DeepSpeed's launcher is the bridge's process launch (torchrun), as torch_distributed's.
    assert parse_entrypoint("python3 -m determined.launch.deepspeed python3 train.py") == (
        Entrypoint(command=["python3", "train.py"], python=True, launched=True)
    )
    assert parse_entrypoint(
        "python3 -m determined.launch.deepspeed --trial model_def:Trial"
    ) == Entrypoint(trial="model_def:Trial")
    with pytest.raises(InvalidArgumentError, match="determined.launch.horovod is not supported"):
        parse_entrypoint("python3 -m determined.launch.horovod python3 train.py")
    with pytest.raises(InvalidArgumentError, match="entrypoint: required"):
        parse_entrypoint(None)


@pytest.fixture()
def mapped() -> Iterator[None]:
    assert _import_map.install(force=True)
    yield
    _import_map.uninstall()


def test_determined_imports_resolve_to_the_bridge(mapped: None) -> None:
    import determined  # type: ignore[import-not-found]
    import determined.pytorch as det_torch  # type: ignore[import-not-found]
    from determined import pytorch  # type: ignore[import-not-found]
    from determined.pytorch import DataLoader, samplers  # type: ignore[import-not-found]
    from determined.pytorch.samplers import RepeatSampler  # type: ignore[import-not-found]

    assert pytorch is det_torch and determined.pytorch is det_torch
    assert DataLoader is lightning_bridge.DataLoader
    assert det_torch.PyTorchTrial is lightning_bridge.PyTorchTrial
    assert samplers.RepeatSampler is RepeatSampler is lightning_bridge.samplers.RepeatSampler
    assert determined.get_cluster_info() is None  # not started by the runner
    with pytest.raises(ModuleNotFoundError, match="determined.pytorch.dsat is not mapped"):
        import determined.pytorch.dsat  # type: ignore[import-not-found]  # noqa: F401
    # determined.experimental holds core_v2 alone; the SDK is refused by name.
    import determined.experimental  # type: ignore[import-not-found]

    with pytest.raises(ImportError, match="talks to a Determined master"):
        determined.experimental.client  # noqa: B018


def test_shim_folder_maps_determined_in_a_subprocess(tmp_path: pathlib.Path) -> None:
    import subprocess

    shim = _import_map.shim_dir(tmp_path)
    code = (
        "from determined.pytorch import Trainer; import determined; "
        "print(Trainer.__module__, determined.pytorch.Batch.__module__)"
    )
    repo = str(pathlib.Path(__file__).resolve().parents[1])
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": f"{shim}:{repo}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "lightning_bridge.translation.fit._trainer_api",
        "lightning_bridge.contract._units",
    ]


def test_command_line_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run"])
    assert info.value.code == 2
    assert "CONFIG" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "c.yaml", "--devices", "0"])
    assert info.value.code == 2
    assert main(["run", "missing.yaml"]) == 2
    assert "experiment config 'missing.yaml' not found" in capsys.readouterr().err


def test_port_calls_the_port_tool(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Any, ...]] = []

    def write_trial_folder(
        target: str, out: pathlib.Path, datamodule: str | None = None, force: bool = False
    ) -> pathlib.Path:
        calls.append((target, out, datamodule, force))
        if target == "bad:Module":
            raise InvalidArgumentError("bad:Module is not a LightningModule")
        return out

    port = types.ModuleType("lightning_bridge.port._write")
    port.write_trial_folder = write_trial_folder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning_bridge.port._write", port)
    out = tmp_path / "trial"
    assert main(["port", "pkg.mod:Net", "--datamodule", "pkg.mod:DM", "--out", str(out)]) == 0
    assert calls == [("pkg.mod:Net", out, "pkg.mod:DM", False)]
    assert f"Wrote trial folder {out}" in capsys.readouterr().out
    assert main(["port", "bad:Module", "--out", str(out), "--force"]) == 2
    assert calls[-1][3] is True
    assert "bad:Module is not a LightningModule" in capsys.readouterr().err
