"""DeepSpeedTrial: Determined's `determined.pytorch.deepspeed` names answered by the bridge,
and trials trained on DeepSpeed's own engine (the ``deepspeed`` marker: the deepspeed session,
which installs DeepSpeed; on the CPU with gloo, ``DS_ACCELERATOR=cpu``)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from lightning_bridge.contract import _import_map

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "deepspeed" / "linear_trial.py"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

# The public names of Determined 0.38.1's `determined.pytorch.deepspeed` (its __init__),
# less DeepSpeedTrialController, its harness's own runner.
DETERMINED_DEEPSPEED_NAMES = {
    "DeepSpeedTrial",
    "DeepSpeedTrialContext",
    "ModelParallelUnit",
    "Trainer",
    "init",
    "make_data_parallel_mpu",
    "make_deepspeed_mpu",
    "overwrite_deepspeed_config",
}


@pytest.fixture
def mapped():
    _import_map.install(force=True)
    try:
        yield
    finally:
        _import_map.uninstall()


def test_determined_deepspeed_names_are_answered(mapped) -> None:
    from determined.pytorch import deepspeed as det_ds

    import lightning_bridge.contract._deepspeed as bridge

    assert set(dir(det_ds)) == DETERMINED_DEEPSPEED_NAMES
    assert det_ds.DeepSpeedTrial is bridge.DeepSpeedTrial
    assert det_ds.overwrite_deepspeed_config is bridge.overwrite_deepspeed_config
    with pytest.raises(AttributeError, match="DeepSpeedTrialController"):
        det_ds.DeepSpeedTrialController  # noqa: B018


def test_overwrite_deepspeed_config_merges_depth_first(tmp_path: pathlib.Path) -> None:
    from lightning_bridge.contract._deepspeed import overwrite_deepspeed_config

    base = {"zero_optimization": {"stage": 1, "overlap_comm": True}, "gradient_clipping": 1.0}
    over = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    merged = overwrite_deepspeed_config(base, over)
    assert merged == {
        "zero_optimization": {"stage": 3, "overlap_comm": True},
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
    }
    assert base["zero_optimization"]["stage"] == 1  # the inputs are unchanged
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(base))
    assert overwrite_deepspeed_config(str(path), over) == merged
    path.write_text('{"gradient_clipping": 1.0, "gradient_clipping": 2.0}')
    with pytest.raises(Exception, match=r"repeats the key\(s\) \['gradient_clipping'\]"):
        overwrite_deepspeed_config(str(path), {})
    with pytest.raises(Exception, match="Cannot read the DeepSpeed config"):
        overwrite_deepspeed_config(str(tmp_path / "missing.json"), {})


@pytest.mark.skipif(HAS_DEEPSPEED, reason="DeepSpeed is installed here")
def test_without_deepspeed_one_message_names_the_extra(mapped) -> None:
    from determined.pytorch import deepspeed as det_ds

    with pytest.raises(ImportError, match=r"pip install 'lightning-bridge\[deepspeed\]'"):
        with det_ds.init(hparams={}):
            pass


def _run(entries: list[list], tmp_path: pathlib.Path, processes: int = 1) -> list[list[dict]]:
    """Run the fixture's entries ([hyperparameters, fit arguments, checkpoint folder]) in one
    process group; the chief's results (and, with several processes, the other ranks')."""
    shim = _import_map.shim_dir(tmp_path)
    out = tmp_path / "out.json"
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]),
    }
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    proc = subprocess.run(
        [*launch, str(FIXTURE), json.dumps(entries), str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads(out.read_text())]
    ranks += [
        json.loads(out.with_name(f"out.json.rank{r}").read_text()) for r in range(1, processes)
    ]
    return ranks


def _close(a: list[list[float]], b: list[list[float]], tol: float) -> bool:
    return all(
        abs(x - y) <= tol for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True)
    )


def _ds(**overrides) -> dict:
    return {"overwrite_deepspeed_args": overrides}


@pytest.mark.deepspeed
def test_fit_loop_trains_like_a_plain_deepspeed_loop(tmp_path: pathlib.Path) -> None:
    """The fit's loop on DeepSpeed's engine: the same weights and losses as a hand-written
    DeepSpeed loop over the same batches; ZeRO 0-3 (and CPU offload) in fp32 train the same
    weights; bf16 close to them; accumulation of 2 calls train_batch twice per batch and steps
    the engine once per batch; checkpoints in Determined's layout after each validation."""
    plain = {**_ds(), "shuffle": False}
    fit = {"max_length": 6}
    ck = str(tmp_path / "ck")
    entries = [[plain, fit, ck], [plain, {**fit, "hand": True}, None]]
    entries += [[_ds(zero_optimization={"stage": s}), fit, f"{ck}{s}"] for s in (0, 1, 2, 3)]
    entries += [
        [_ds(bf16={"enabled": True}), fit, f"{ck}bf16"],
        [_ds(gradient_accumulation_steps=2), fit, f"{ck}acc"],
        [
            _ds(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}),
            fit,
            f"{ck}o",
        ],
    ]
    (results,) = _run(entries, tmp_path)
    bridge, hand = results[0], results[1]
    assert _close(bridge["weights"], hand["weights"], 0.0)
    losses = hand["losses"]
    assert [t["loss"] for t in bridge["training"]] == pytest.approx(
        [sum(losses[:3]) / 3, sum(losses[3:]) / 3],
        rel=1e-6,  # float32 means
    )
    stage0 = results[2]
    for r in results[2:6] + [results[8]]:
        assert r["calls"] == [0, 1, 2, 3, 4, 5]
        assert (r["micro_steps"], r["global_steps"]) == (6, 6)
        assert _close(r["weights"], stage0["weights"], 1e-6), r["weights"]
        for mine, theirs in zip(
            r["training"] + r["validation"], stage0["training"] + stage0["validation"], strict=True
        ):
            assert mine == pytest.approx(theirs, abs=1e-5)
    assert [v["batches"] for v in stage0["validation"]] == [3, 6]
    assert [t["batches"] for t in stage0["training"]] == [3, 6]
    assert stage0["validation"][1]["val_loss"] < stage0["validation"][0]["val_loss"]
    assert stage0["data"] == {"rows": 64}
    bf16 = results[6]
    assert not _close(bf16["weights"], stage0["weights"], 1e-6)
    assert _close(bf16["weights"], stage0["weights"], 0.05)
    accumulated = results[7]
    assert accumulated["calls"] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert (accumulated["micro_steps"], accumulated["global_steps"]) == (12, 6)
    # Determined's DeepSpeedTrial layout, one checkpoint per validation.
    assert len(stage0["checkpoints"]) == 2
    last = pathlib.Path(stage0["checkpoints"][-1])
    assert (last.parent / "latest").read_text().strip() == last.name
    names = {p.name for p in last.iterdir()}
    assert {"det_state_dict_rank0.pth", "trial_state.pkl", "load_data.json", "model0"} <= names
    assert (last / "latest").read_text().strip() == "model0"  # DeepSpeed's own
    assert json.loads((last / "load_data.json").read_text())["trial_type"] == "DeepSpeedTrial"


@pytest.mark.deepspeed
@pytest.mark.parametrize("processes", [1, 2])
def test_stopped_and_continued_runs_end_as_the_uninterrupted_one(
    tmp_path: pathlib.Path, processes: int
) -> None:
    """A run paused mid-epoch after batch 4 of 6 (after a validation: by SIGTERM with one
    process; by its length with two) and continued from its latest checkpoint ends with the
    uninterrupted run's weights and last metrics: ZeRO 0 and 3, shuffled data; with 2
    processes (gloo) every rank holds the same weights."""
    entries = []
    for stage in (0, 3):
        hp = _ds(zero_optimization={"stage": stage})
        whole, part = str(tmp_path / f"whole{stage}"), str(tmp_path / f"part{stage}")
        entries += [
            [hp, {"max_length": 6}, whole],
            # One process stops on SIGTERM after the batch it came in; several agree on a
            # batch some batches later (the fit's spaced agreement): there the run is cut
            # at batch 4 by its length instead, which exercises the same checkpoint.
            [{**hp, "sigterm_at": 3}, {"max_length": 6}, part]
            if processes == 1
            else [hp, {"max_length": 4}, part],
            [hp, {"max_length": 6, "latest_checkpoint": "latest"}, part],
        ]
    ranks = _run(entries, tmp_path, processes=processes)
    for results in ranks:
        for i in (0, 3):
            whole, first, second = results[i : i + 3]
            assert first["stopped"] == (processes == 1) and first["calls"] == [0, 1, 2, 3]
            assert not whole["stopped"] and not second["stopped"]
            assert _close(second["weights"], whole["weights"], 0.0), f"entries {i}"
            assert second["calls"] == [4, 5]
            # DeepSpeed restores the optimizer steps; its micro-step count restarts.
            assert (second["micro_steps"], second["global_steps"]) == (2, 6)
    chief = ranks[0]
    for i in (0, 3):
        whole, second = chief[i], chief[i + 2]
        assert second["validation"][-1] == whole["validation"][-1]
        assert second["training"][-1]["batches"] == 6
    for other in ranks[1:]:
        assert _close(other[0]["weights"], chief[0]["weights"], 0.0)


def _bridge(
    *args: str, cwd: pathlib.Path, path: tuple[pathlib.Path, ...] = (), **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    env["DS_ACCELERATOR"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [*map(str, path), str(pathlib.Path(__file__).resolve().parents[1])]
    )
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


RUN_CONFIG = """\
name: deepspeed-linear
entrypoint: {entrypoint}
hyperparameters:
  overwrite_deepspeed_args:
    zero_optimization: {{stage: {stage}}}
searcher: {{name: single, metric: val_loss, max_length: {{batches: 6}}}}
min_validation_period: {{batches: 3}}
resources: {{slots_per_trial: {processes}}}
"""


@pytest.mark.deepspeed
@pytest.mark.parametrize("processes", [1, 2])
def test_lightning_bridge_run_records_a_deepspeed_trial(
    tmp_path: pathlib.Path, processes: int
) -> None:
    """`lightning-bridge run` with a DeepSpeedTrial class entrypoint (1 process, or 2 under
    torchrun, behind `python3 -m determined.launch.deepspeed`): the record shows its
    validations and its checkpoints, in Determined's layout."""
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "model_def.py").write_text(FIXTURE.read_text())
    # Two processes through Determined's DeepSpeed launcher word (the bridge's torchrun).
    entrypoint = "model_def:LinearTrial"
    if processes > 1:
        entrypoint = "python3 -m determined.launch.deepspeed --trial " + entrypoint
    config = RUN_CONFIG.format(stage=2, processes=processes, entrypoint=entrypoint)
    (folder / "const.yaml").write_text(config)
    ws = ["--workspace", str(tmp_path / "ws")]
    ran = _bridge("run", "const.yaml", *ws, cwd=folder)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    described = _bridge("experiment", "describe", "1", "--json", *ws, cwd=folder)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert data["state"] == "COMPLETED"
    text = json.dumps(data)
    assert "val_loss" in text
    listed = _bridge("checkpoint", "list", "--json", *ws, cwd=folder)
    assert listed.returncode == 0, listed.stderr
    checkpoints = json.loads(listed.stdout)
    assert len(checkpoints) >= 1
    location = pathlib.Path(checkpoints[-1]["location"])
    names = {p.name for p in location.iterdir()}
    ranks = {f"det_state_dict_rank{r}.pth" for r in range(processes)}
    assert ranks | {"trial_state.pkl", "load_data.json", "model0"} <= names
    # The record's download: the engine folder, DeepSpeed's `latest` and the bridge's files.
    got = _bridge(
        "checkpoint", "download", checkpoints[-1]["uuid"], "--out", str(tmp_path / "dl"),
        "--json", *ws, cwd=folder,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    downloaded = pathlib.Path(json.loads(got.stdout)["downloaded_to"])
    assert ranks | {"model0", "latest", "load_data.json", "trial_state.pkl"} <= {
        p.name for p in downloaded.iterdir()
    }
    assert (downloaded / "latest").read_text().strip() == "model0"
    # load_trial_from_checkpoint_path says how to load it; DeepSpeed's own function reads the
    # module's weights (ZeRO 2 here; its partitions of both processes merged).
    from lightning_bridge._errors import InvalidCheckpointError
    from lightning_bridge.contract._load import load_trial_from_checkpoint_path

    with pytest.raises(InvalidCheckpointError, match=r"get_fp32_state_dict_from_zero_checkpoint"):
        load_trial_from_checkpoint_path(downloaded)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    weights = get_fp32_state_dict_from_zero_checkpoint(str(downloaded), tag="model0")
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        "0.weight": (16, 8),
        "0.bias": (16,),
        "2.weight": (1, 16),
        "2.bias": (1,),
    }


PAUSE_CONFIG = """\
name: deepspeed-pause
entrypoint: model_def:LinearTrial
hyperparameters:
  overwrite_deepspeed_args:
    zero_optimization: {{stage: {stage}}}
{gate}searcher: {{name: single, metric: val_loss, max_length: {{batches: 12}}}}
min_validation_period: {{batches: 4}}
reproducibility: {{experiment_seed: 7}}
resources: {{slots_per_trial: 2}}
"""


def _start_bridge(*args: str, cwd: pathlib.Path) -> subprocess.Popen[str]:
    """`_bridge`'s command, started (its own session: the test ends its group if it fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(var, None)
    env["DS_ACCELERATOR"] = "cpu"
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def _merged_weights(checkpoint: str | pathlib.Path) -> dict:
    """A checkpoint's module weights, merged from the ranks' shards by DeepSpeed's own
    function."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return dict(get_fp32_state_dict_from_zero_checkpoint(str(checkpoint), tag="model0"))


def _trial(folder: pathlib.Path) -> tuple[dict, dict]:
    """Experiment 1's only trial in the record, and its last checkpoint's merged weights."""
    ws = folder.with_name(folder.name + "-ws")
    described = _bridge("experiment", "describe", "1", "--json", "--workspace", str(ws), cwd=folder)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    (trial,) = data["trials"]
    last = max(data["checkpoints"], key=lambda c: c["batches"])
    assert last["batches"] == trial["batches_trained"], data
    return trial, _merged_weights(last["location"])


PAUSE_STAGES = (1, 2, 3)


def _paused_stages() -> tuple[int, ...]:
    """The ZeRO stages the pause test runs with this DeepSpeed: all on 0.16.9 (Determined's
    era); ZeRO 3 alone on the releases after 0.16 (each stage costs two two-process runs of
    CI time; stages 1 and 2 continue as exactly there, measured by hand on 0.19.8)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("deepspeed")
    except PackageNotFoundError:  # a session without DeepSpeed deselects the test
        return PAUSE_STAGES
    release = tuple(int(part) for part in installed.split("+")[0].split(".")[:2])
    return PAUSE_STAGES if release < (0, 17) else (3,)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list, dict]]:
    """The uninterrupted two-process runs of the paused trial (seeded as under
    `lightning-bridge run`: the trial seeds its model and data itself), one per ZeRO stage,
    in one process group: the chief's validations and the last checkpoint's merged weights."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    fit = {"max_length": 12, "validation_period": 4}
    stages = _paused_stages()
    entries = [[_ds(zero_optimization={"stage": s}), fit, str(tmp / f"whole{s}")] for s in stages]
    chief = _run(entries, tmp, processes=2)[0]
    return {
        s: (r["validation"], _merged_weights(r["checkpoints"][-1]))
        for s, r in zip(stages, chief, strict=True)
    }


@pytest.mark.deepspeed
@pytest.mark.parametrize(
    "stage",
    [
        pytest.param(
            s,
            marks=pytest.mark.skipif(
                s not in _paused_stages(),
                reason="ZeRO 1 and 2 run on DeepSpeed 0.16.9 (CI time; see _paused_stages)",
            ),
        )
        for s in PAUSE_STAGES
    ],
)
def test_paused_mid_epoch_and_continued_ends_as_the_uninterrupted_run(
    tmp_path: pathlib.Path, stage: int, uninterrupted: dict[int, tuple[list, dict]]
) -> None:
    """Two processes under `lightning-bridge run`, ZeRO `stage`: held (by a gate) in batch 1
    of an epoch of 8, `experiment pause`d, then `experiment continue`d, the run ends with the
    uninterrupted run's weights (merged from the ranks' shards by DeepSpeed's
    `get_fp32_state_dict_from_zero_checkpoint`) and validation metrics, exactly.

    The stop is at batch 3 by construction: the signal comes while both ranks wait at the
    gate in batch 1, so the ranks' stop agreement started after batch 1 holds no signal and
    the one after batch 2 (read after batch 3) does; the held batch keeps the agreement's
    spacing at one batch."""
    from tests._folders import GATE_CODE, Gate, finish, wait_for

    gate = Gate.at(tmp_path / "gate")
    folder = tmp_path / "paused"
    folder.mkdir()
    # The gate (after the trial's text) replaces the fixture's `hold_at_gate`.
    (folder / "model_def.py").write_text(FIXTURE.read_text() + GATE_CODE)
    hold = f"  gate: {gate.path}\n  hold_at: 1\n"
    (folder / "const.yaml").write_text(PAUSE_CONFIG.format(stage=stage, gate=hold))
    ws = ["--workspace", str(tmp_path / "paused-ws")]
    run = _start_bridge("run", "const.yaml", *ws, cwd=folder)
    try:
        wait_for(lambda: gate.reached() == 2, run, timeout=300, what="both ranks at the gate")
        paused = _bridge("experiment", "pause", "1", *ws, cwd=folder)
        assert paused.returncode == 0, paused.stdout + paused.stderr
        gate.release()
        code, out, err, _ = finish(run, 300)
        assert code == 0, out[-3000:] + err[-6000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 9)
            run.communicate()
    assert "Stopped by SIGTERM after batch 3" in out, out[-3000:]
    stopped, _ = _trial(folder)
    assert (stopped["state"], stopped["batches_trained"]) == ("STOPPED", 3), stopped
    continued = _bridge("experiment", "continue", "1", *ws, cwd=folder)
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-6000:]
    trial, weights = _trial(folder)
    assert (trial["state"], trial["batches_trained"]) == ("COMPLETED", 12), trial
    validations, reference = uninterrupted[stage]
    assert [(v["batches"], v["values"]["val_loss"]) for v in trial["validation"]] == [
        (v["batches"], v["val_loss"]) for v in validations
    ]
    assert [v["batches"] for v in trial["validation"]] == [4, 8, 12]
    assert set(weights) == set(reference)
    for key, value in weights.items():
        assert torch.equal(value, reference[key]), (key, value - reference[key])


PIPELINE = FIXTURE.with_name("pipeline_trial.py")
PIPELINE_CONFIG = """\
name: deepspeed-pipeline
entrypoint: python3 -m determined.launch.deepspeed --trial model_def:PipelineTrial
hyperparameters: {{{gate}}}
searcher: {{name: single, metric: val_loss, max_length: {{batches: 6}}}}
min_validation_period: {{batches: 2}}
reproducibility: {{experiment_seed: 7}}
resources: {{slots_per_trial: 2}}
"""


def _pipeline_weights(checkpoint: str | pathlib.Path) -> dict:
    """A pipeline engine's layers from a checkpoint (`model0/layer_NN-model_states.pt`, each
    stage's own layers, written by the stage's process)."""
    return {
        f"{path.name}:{key}": value
        for path in sorted((pathlib.Path(checkpoint) / "model0").glob("layer_*-model_states.pt"))
        for key, value in torch.load(path, weights_only=True).items()
    }


@pytest.mark.deepspeed
def test_a_pipeline_parallel_trial_runs_pauses_and_continues(tmp_path: pathlib.Path) -> None:
    """A DeepSpeedTrial of a `PipelineModule` in two stages (one per process, gloo), its
    `train_batch` / `eval_batch` drawing a batch's 2 micro batches through the iterator, under
    `lightning-bridge run` (Determined's DeepSpeed launcher word): its training and validation
    metrics reach the record, its checkpoints hold each stage's layers; paused in batch 3 and
    continued, it ends with the uninterrupted run's layers and validation metrics exactly.
    Where Determined 0.38.1 is installed, its own runner trains the same layers (within
    1e-6)."""
    from tests._folders import GATE_CODE, Gate, finish, wait_for

    gate = Gate.at(tmp_path / "gate")
    folders = {}
    for name, hold in (("whole", ""), ("paused", f"gate: {gate.path}, hold_at: 1")):
        folder = folders[name] = tmp_path / name
        folder.mkdir()
        # The gate (after the trial's text) replaces the fixture's `hold_at_gate`.
        (folder / "model_def.py").write_text(PIPELINE.read_text() + GATE_CODE)
        (folder / "const.yaml").write_text(PIPELINE_CONFIG.format(gate=hold))
    held = folders["paused"]
    ws = ["--workspace", str(tmp_path / "paused-ws")]
    runs = [
        _start_bridge("run", "const.yaml", "--workspace", str(tmp_path / f"{name}-ws"), cwd=f)
        for name, f in folders.items()
    ]
    # Determined 0.38.1's own runner on the same trial, where it is installed beside DeepSpeed
    # (the session of DeepSpeed 0.16.9): each stage's layers after the same 6 batches.
    determined = importlib.util.find_spec("determined") is not None
    if determined:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
            env.pop(var, None)
        # Its local checkpoint storage, apart from its working folder (copied into each).
        env.update(DS_ACCELERATOR="cpu", XDG_DATA_HOME=str(tmp_path / "xdg"))
        (tmp_path / "determined").mkdir()
        runs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc_per_node=2",
                    str(PIPELINE.with_name("determined_pipeline_runner.py")),
                    str(tmp_path),
                ],
                cwd=tmp_path / "determined",
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )  # fmt: skip
        )
    try:
        wait_for(lambda: gate.reached() == 2, runs[1], timeout=300, what="both stages at the gate")
        paused = _bridge("experiment", "pause", "1", *ws, cwd=held)
        assert paused.returncode == 0, paused.stdout + paused.stderr
        gate.release()
        outputs = [finish(run, 300) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, 9)
                run.communicate()
    for code, out, err, _ in outputs:
        assert code == 0, out[-3000:] + err[-6000:]
    assert "Stopped by SIGTERM after batch 3" in outputs[1][1], outputs[1][1][-3000:]
    continued = _bridge("experiment", "continue", "1", *ws, cwd=held)
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-6000:]
    ended = {}
    for name, folder in folders.items():
        described = _bridge(
            "experiment", "describe", "1", "--json", "--workspace",
            str(tmp_path / f"{name}-ws"), cwd=folder,
        )  # fmt: skip
        assert described.returncode == 0, described.stderr
        data = json.loads(described.stdout)
        (trial,) = data["trials"]
        assert (trial["state"], trial["batches_trained"]) == ("COMPLETED", 6), trial
        last = max(data["checkpoints"], key=lambda c: c["batches"])
        assert last["batches"] == 6
        names = {p.name for p in (pathlib.Path(last["location"]) / "model0").iterdir()}
        # Each stage's layers and its own model states, DeepSpeed's pipeline layout.
        assert {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"} <= names, names
        ended[name] = (trial, _pipeline_weights(last["location"]))
    (whole, reference), (trial, weights) = ended["whole"], ended["paused"]
    assert [v["batches"] for v in trial["validation"]] == [2, 4, 6]
    assert [v["values"]["val_loss"] for v in trial["validation"]] == [
        v["values"]["val_loss"] for v in whole["validation"]
    ]
    assert trial["training"] and all(t["values"]["loss"] > 0 for t in trial["training"])
    assert (
        trial["validation"][-1]["values"]["val_loss"] < whole["validation"][0]["values"]["val_loss"]
    )
    assert len(reference) >= 6 and set(weights) == set(reference)  # 3 linear layers' tensors
    for key, value in weights.items():
        assert torch.equal(value, reference[key]), (key, value - reference[key])
    if determined:
        code, out, err, _ = outputs[2]
        assert code == 0, out[-3000:] + err[-6000:]
        theirs = {}
        for rank in (0, 1):
            theirs.update(json.loads((tmp_path / f"rank{rank}.json").read_text()))
        assert set(theirs) == set(reference)
        for key, value in reference.items():
            assert _close([value.flatten().tolist()], [theirs[key]], 1e-6), key


def test_a_deepspeed_trial_class_is_a_trial_entrypoint(mapped) -> None:
    """`lightning-bridge run` accepts a DeepSpeedTrial class as its entrypoint and tells it
    from a PyTorchTrial (it is trained on DeepSpeed's engine)."""
    from determined import pytorch
    from determined.pytorch import deepspeed as det_ds

    from lightning_bridge.contract._trial import is_deepspeed_trial_class, is_trial_class

    class Ds(det_ds.DeepSpeedTrial):
        pass

    class Pt(pytorch.PyTorchTrial):
        pass

    assert is_trial_class(Ds) and is_deepspeed_trial_class(Ds)
    assert is_trial_class(Pt) and not is_deepspeed_trial_class(Pt)
    assert not is_trial_class(object) and not is_deepspeed_trial_class(int)


@pytest.mark.deepspeed
def test_parity_with_determined_runner_and_its_checkpoints(tmp_path: pathlib.Path) -> None:
    """Determined 0.38.1's own DeepSpeedTrial runner (on the CPU, its device check replaced in
    the fixture) and the bridge train the same trial to the same weights; the bridge continues
    Determined's mid-run checkpoint to the same weights. Needs determined==0.38.1 beside
    DeepSpeed (the deepspeed session of DeepSpeed 0.16.9, Determined's era)."""
    if importlib.util.find_spec("determined") is None:
        pytest.skip("determined==0.38.1 is not installed beside DeepSpeed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    env.update(
        {
            "DS_ACCELERATOR": "cpu",
            "XDG_DATA_HOME": str(tmp_path / "xdg"),  # Determined's local checkpoint storage
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29631",
        }
    )
    runner = FIXTURE.with_name("determined_runner.py")
    det_out = tmp_path / "det.json"
    # Determined copies its working folder into each checkpoint: one apart from its storage.
    det_cwd = tmp_path / "determined"
    det_cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, str(runner), str(det_out)],
        cwd=det_cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    determined_weights = json.loads(det_out.read_text())
    import pickle

    saved = {
        pickle.loads((p.parent / "trial_state.pkl").read_bytes())["batches_trained"]: p.parent
        for p in (tmp_path / "xdg").rglob("det_state_dict_rank0.pth")
    }
    assert sorted(saved) == [3, 6]
    plain = {**_ds(), "shuffle": False}
    entries = [
        [plain, {"max_length": 6}, str(tmp_path / "ck")],
        [plain, {"max_length": 6, "latest_checkpoint": str(saved[3])}, str(tmp_path / "ck2")],
    ]
    (results,) = _run(entries, tmp_path)
    assert _close(results[0]["weights"], determined_weights, 1e-6)
    assert results[1]["calls"] == [3, 4, 5]
    assert _close(results[1]["weights"], determined_weights, 1e-6)


FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
DCGAN = FIXTURES / "determined_examples" / "deepspeed_dcgan"
# A `torchvision` that serves made-up MNIST images without a download (its docstring).
STANDIN = FIXTURES / "torchvision_standin"


def _dcgan_folder(tmp_path: pathlib.Path, processes: int) -> pathlib.Path:
    """Determined's dcgan example, its files unchanged, with a config written from its
    `mnist.yaml`: narrow networks and a batch of 8 through its own hyperparameters
    (`overwrite_deepspeed_args` over its `ds_config.json`, torch's Adam on the CPU), no data
    workers, the data folder in `tmp_path`, `processes` slots."""
    folder = tmp_path / "dcgan"
    shutil.copytree(DCGAN, folder)
    config = yaml.safe_load((folder / "mnist.yaml").read_text())
    data_root = tmp_path / "data"
    data_root.mkdir()
    config["data"]["dataroot"] = str(data_root)
    config["hyperparameters"].update(
        noise_length=4,
        generator_width_base=2,
        discriminator_width_base=2,
        data_workers=0,
        overwrite_deepspeed_args={
            "train_batch_size": 8,
            "optimizer": {"params": {"torch_adam": True}},
        },
    )
    config["resources"]["slots_per_trial"] = processes
    (folder / "small.yaml").write_text(yaml.safe_dump(config))
    return folder


def _deepspeed_release() -> tuple[int, ...]:
    import deepspeed

    return tuple(int(part) for part in deepspeed.__version__.split("+")[0].split(".")[:3])


def _run_dcgan(tmp_path: pathlib.Path, processes: int) -> subprocess.CompletedProcess[str]:
    folder = _dcgan_folder(tmp_path, processes)
    # Test mode (one training batch, one validation batch): the example's trainer.py asks
    # for 200 batches itself.
    return _bridge(
        "run", "small.yaml", "--test", "--workspace", str(tmp_path / "ws"),
        cwd=folder, path=(STANDIN,), MNIST_STANDIN_TRAIN="32",
    )  # fmt: skip


@pytest.mark.deepspeed
@pytest.mark.parametrize("processes", [1, 2])
def test_determined_dcgan_example_runs_unchanged(tmp_path: pathlib.Path, processes: int) -> None:
    """Determined's `examples/deepspeed/dcgan` (two engines, a Trainer script behind
    `python3 -m determined.launch.deepspeed`) through `lightning-bridge run --test`, 1 and 2
    processes: exit 0, its training metrics and its validation in the record, its checkpoint
    in Determined's layout with both engines, its images in the run's TensorBoard folder."""
    if _deepspeed_release() >= (0, 18, 3):
        pytest.skip("DeepSpeed 0.18.3 and later refuse this trial (the test below)")
    ran = _run_dcgan(tmp_path, processes)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    folder = tmp_path / "dcgan"
    ws = ["--workspace", str(tmp_path / "ws")]
    described = _bridge("experiment", "describe", "1", "--json", *ws, cwd=folder)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert data["state"] == "COMPLETED", data
    (trial,) = data["trials"]
    (training,) = trial["training"]
    assert training["batches"] == 1
    assert set(training["values"]) == {"errD", "errG", "D_x", "D_G_z1", "D_G_z2"}
    assert all(0.0 < value < 100.0 for value in training["values"].values()), training
    (validation,) = trial["validation"]
    assert validation["values"]["no_validation_metric"] == 0.0
    listed = _bridge("checkpoint", "list", "--json", *ws, cwd=folder)
    assert listed.returncode == 0, listed.stderr
    (checkpoint,) = json.loads(listed.stdout)
    location = pathlib.Path(checkpoint["location"])
    names = {p.name for p in location.iterdir()}
    ranks = {f"det_state_dict_rank{r}.pth" for r in range(processes)}
    # Both engines (generator, discriminator), as DeepSpeedTrial.save writes them.
    assert ranks | {"model0", "model1", "latest", "trial_state.pkl", "load_data.json"} <= names
    tensorboard = pathlib.Path(trial["run_dir"]) / "tensorboard"
    assert any(tensorboard.glob("events.out.tfevents.*")), "the example's images"


@pytest.mark.deepspeed
def test_determined_dcgan_example_refused_in_one_line_on_newer_deepspeed(
    tmp_path: pathlib.Path,
) -> None:
    """DeepSpeed 0.18.3 and later refuse the dcgan example's generator loss through its
    discriminator engine (ZeRO stage 0): the run fails with one line naming the DeepSpeed
    releases that run it, no traceback."""
    if _deepspeed_release() < (0, 18, 3):
        pytest.skip("DeepSpeed before 0.18.3 runs this trial (the test above)")
    ran = _run_dcgan(tmp_path, 1)
    assert ran.returncode != 0
    output = ran.stdout + ran.stderr
    lines = [line for line in output.splitlines() if "refuses this trial" in line]
    assert len(lines) == 1, output[-6000:]
    assert "DeepSpeed 0.16.9 to 0.18.2 runs it" in lines[0]
    assert "pip install 'deepspeed>=0.16.9,<0.18.3'" in lines[0]
    assert "Traceback" not in output, output[-6000:]


EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "deepspeed"


@pytest.mark.deepspeed
def test_the_deepspeed_example_runs_in_test_mode(tmp_path: pathlib.Path) -> None:
    """examples/deepspeed (the examples session leaves it to this session, which installs
    DeepSpeed) through `lightning-bridge run const.yaml --test`, as a user runs it: exit 0,
    its training loss and validation loss in the record, a checkpoint with its engine."""
    ws = ["--workspace", str(tmp_path / "ws")]
    ran = _bridge("run", "const.yaml", "--test", *ws, cwd=EXAMPLE)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    described = _bridge("experiment", "describe", "1", "--json", *ws, cwd=EXAMPLE)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert data["state"] == "COMPLETED", data
    (trial,) = data["trials"]
    assert trial["training"][-1]["values"]["loss"] > 0.0
    assert trial["validation"][-1]["values"]["val_loss"] > 0.0
    listed = _bridge("checkpoint", "list", "--json", *ws, cwd=EXAMPLE)
    assert listed.returncode == 0, listed.stderr
    (checkpoint,) = json.loads(listed.stdout)
    assert (pathlib.Path(checkpoint["location"]) / "model0").is_dir()


SEARCH_CONFIG = """\
name: deepspeed-search
entrypoint: model_def:LinearTrial
hyperparameters:
  shuffle: false
  overwrite_deepspeed_args:
    optimizer:
      params:
        lr: {type: log, base: 10, minval: -3, maxval: -1}
searcher:
  name: adaptive_asha
  metric: val_loss
  smaller_is_better: true
  time_metric: batches
  max_time: 8
  max_trials: 3
  max_concurrent_trials: 1
  mode: aggressive
  divisor: 2
  max_rungs: 2
reproducibility: {experiment_seed: 3}
"""


@pytest.mark.deepspeed
def test_an_asha_search_over_a_deepspeed_config_value(tmp_path: pathlib.Path) -> None:
    """`adaptive_asha` over the optimizer's learning rate of the DeepSpeed config (sampled
    into `overwrite_deepspeed_args`, merged by `overwrite_deepspeed_config`): three trials,
    each trained with its own rate (distinct losses from the same weights and data), ASHA's
    rungs at 4 and 8 batches, the trials it does not promote stopped at their rung."""
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "model_def.py").write_text(FIXTURE.read_text())
    (folder / "search.yaml").write_text(SEARCH_CONFIG)
    ws = ["--workspace", str(tmp_path / "ws")]
    ran = _bridge("run", "search.yaml", *ws, cwd=folder)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    described = _bridge("experiment", "describe", "1", "--json", *ws, cwd=folder)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    trials = data["trials"]
    seen = [
        (
            t["state"],
            t["batches_trained"],
            t["hparams"]["overwrite_deepspeed_args"]["optimizer"]["params"]["lr"],
            [(v["batches"], v["values"]["val_loss"]) for v in t["validation"]],
        )
        for t in trials
    ]
    assert data["state"] == "COMPLETED", seen
    assert len(trials) == 3, seen
    rates = [lr for _, _, lr, _ in seen]
    assert all(1e-3 <= lr <= 1e-1 for lr in rates) and len(set(rates)) == 3, seen
    # Each trial validated at the first rung; its loss there is its rate's.
    first_rung = [dict(validations)[4] for *_, validations in seen]
    assert len(set(first_rung)) == 3, seen
    assert sorted(batches for _, batches, _, _ in seen)[0] == 4, seen  # stopped at its rung
    assert max(batches for _, batches, _, _ in seen) == 8, seen
