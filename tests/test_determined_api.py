"""`determined` as scripts use it, under the mapping; a seed for every trial; the startup hook.

The names listed here are the ones Determined's own PyTorch examples, end-to-end test folders
and PyTorch user guide (0.38.1) read from `determined` and `determined.pytorch`, written down
from reading them; the tests use code of their own.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import yaml

import lightning_bridge
from lightning_bridge.contract import _import_map
from lightning_bridge.experiment.cli._main import main
from tests._trials import LinearTrial, fit

# What the examples (tutorials/mnist_pytorch, deepspeed/dcgan, features/*), the e2e fixtures
# (mnist_pytorch/*) and the PyTorch user guide read from `determined.pytorch`.
PYTORCH_EXAMPLE_NAMES = [
    "Batch",
    "CheckpointLoadContext",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchExperimentalContext",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "TorchData",
    "Trainer",
    "init",
    "load_trial_from_checkpoint_path",
    "samplers",
]
# ... and from the top-level package (`import determined as det`).
DETERMINED_EXAMPLE_NAMES = ["LOG_FORMAT", "get_cluster_info", "InvalidHP", "import_from_path"]


@pytest.fixture()
def mapped() -> Iterator[None]:
    assert _import_map.install(force=True)
    yield
    _import_map.uninstall()


def test_every_name_the_examples_use_is_the_bridges(mapped: None) -> None:
    import determined as det  # type: ignore[import-not-found]
    from determined import core, pytorch  # type: ignore[import-not-found]
    from determined.pytorch.samplers import (  # type: ignore[import-not-found]
        DistributedBatchSampler,
    )

    for name in PYTORCH_EXAMPLE_NAMES:
        if name != "samplers":
            assert getattr(pytorch, name) is getattr(lightning_bridge, name), name
    for name in DETERMINED_EXAMPLE_NAMES:
        assert getattr(det, name) is not None, name
    assert det.InvalidHP is lightning_bridge.InvalidHP
    assert det.pytorch is pytorch and det.core is core
    # The user guide's torch-distributed launch: init(distributed=core.DistributedContext...).
    assert core.DistributedContext is lightning_bridge.DistributedContext
    assert pytorch.samplers.RepeatBatchSampler is lightning_bridge.samplers.RepeatBatchSampler
    assert DistributedBatchSampler is lightning_bridge.samplers.DistributedBatchSampler
    assert pytorch.adapt_batch_sampler is lightning_bridge.adapt_batch_sampler
    # Determined's names only: the bridge's own extras stay on `lightning_bridge`.
    for extra in ("TrialModule", "BridgeError", "__version__", "lightning_trial"):
        with pytest.raises(AttributeError, match="it holds Batch, CheckpointLoadContext"):
            getattr(pytorch, extra)
    assert "TrialModule" not in dir(pytorch) and "TrialModule" not in pytorch.__all__


def test_log_format_logs_as_on_determined(mapped: None, capsys: pytest.CaptureFixture[str]) -> None:
    import determined as det

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(det.LOG_FORMAT))
    log = logging.getLogger("mnist")
    log.addHandler(handler)
    try:
        log.warning("hello")
    finally:
        log.removeHandler(handler)
    assert capsys.readouterr().out == f"WARNING: [{os.getpid()}] mnist: hello\n"


@pytest.mark.parametrize(
    ("statement", "error", "says"),
    [
        ("from determined.experimental import client", ImportError, "talks to a Determined master"),
        (
            "from determined.experimental import Determined",
            ImportError,
            "lightning-bridge experiment",
        ),
        ("from determined.pytorch import experimental", ImportError, "torch_batch_process"),
        ("import determined.pytorch.dsat", ImportError, "DeepSpeed autotuning"),
        ("import determined.launch.torch_distributed", ImportError, "torchrun"),
        ("import determined.keras", ImportError, "TensorFlow trials run only"),
        ("import determined as det; det.ipc", AttributeError, "it holds ClusterInfo"),
        ("from determined import util; util.json_encode", AttributeError, "holds merge_dicts"),
    ],
)
def test_what_is_not_mapped_is_refused_by_name(
    mapped: None, statement: str, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=None) as info:
        exec(statement, {})
    message = str(info.value) + str(info.value.__cause__ or "")
    assert says in message, message


def test_determineds_util_merge_dicts_merges_depth_first_into_a_copy(mapped: None) -> None:
    """What Determined's `hf_trainer_api` examples import from `determined.util`."""
    from determined import util  # type: ignore[import-not-found]

    base = {"zero_optimization": {"stage": 1, "overlap_comm": True}, "fp16": {"enabled": True}}
    source = {"zero_optimization": {"stage": 2}, "train_batch_size": 16}
    merged = util.merge_dicts(base, source)
    assert merged == {
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "fp16": {"enabled": True},
        "train_batch_size": 16,
    }
    assert base["zero_optimization"] == {"stage": 1, "overlap_comm": True}
    assert source == {"zero_optimization": {"stage": 2}, "train_batch_size": 16}


def test_checkpoint_load_context_and_import_from_path(
    mapped: None, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import determined as det
    from determined import pytorch

    # The current model_def and a checkpoint's older one, imported side by side.
    (tmp_path / "model_def.py").write_text("VERSION = 'current'\n")
    code = tmp_path / "ckpt" / "code"
    code.mkdir(parents=True)
    (code / "model_def.py").write_text(
        textwrap.dedent(
            """
            import torch
            from determined import pytorch

            VERSION = "checkpoint"

            class T(pytorch.PyTorchTrial):
                def __init__(self, context, scale):
                    self.context = context
                    self.model = context.wrap_model(torch.nn.Linear(2, 1))
                    self.scale = scale * context.get_hparam("k")

                build_training_data_loader = build_validation_data_loader = None
                train_batch = evaluate_batch = None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import model_def as current  # type: ignore[import-not-found]

    with det.import_from_path(code):
        import model_def as old  # type: ignore[import-not-found]
    assert (current.VERSION, old.VERSION) == ("current", "checkpoint")
    assert sys.modules["model_def"] is current  # the block's imports are gone again

    context = pytorch.CheckpointLoadContext(hparams={"k": 3})
    trial = old.T(context, scale=2)  # the trial's own extra arguments, as Determined's allows
    assert trial.scale == 6 and context.get_trial_seed() == 0
    assert context.distributed.get_size() == 1 and context.get_hparams() == {"k": 3}
    sys.modules.pop("model_def", None)


# ----- a seed for every trial -----------------------------------------------------------

SEEDED_TRIAL = """
import json

import torch
from determined import pytorch


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, generator=g), torch.randn(1, generator=g)


class Seeded(pytorch.PyTorchTrial):
    # Weights from the global RNG: what init() seeded decides them.
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(3, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
        with open("seen.json", "w") as f:
            json.dump({"seed": context.get_trial_seed(),
                       "w": self.model.weight.tolist()}, f)

    def build_training_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=4)

    def build_validation_data_loader(self):
        return pytorch.DataLoader(Data(), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""

SEEDED_CONFIG: dict[str, Any] = {
    "name": "seeded",
    "entrypoint": "model_def:Seeded",
    "hyperparameters": {"global_batch_size": 4},
    "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 2}},
}


def _folder(root: pathlib.Path, hook: str | None = None, **config: Any) -> pathlib.Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model_def.py").write_text(SEEDED_TRIAL)
    if hook is not None:
        (root / "startup-hook.sh").write_text(textwrap.dedent(hook))
    path = root / "const.yaml"
    path.write_text(yaml.safe_dump({**SEEDED_CONFIG, **config}))
    return path


@pytest.fixture()
def fresh_imports() -> Iterator[None]:
    path = list(sys.path)
    yield
    _import_map.uninstall()
    sys.path[:] = path
    sys.modules.pop("model_def", None)


def _describe(capsys: pytest.CaptureFixture[str], experiment_id: int) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["experiment", "describe", str(experiment_id), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_a_run_without_a_seed_gets_one_recorded_and_repeatable(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], fresh_imports: None
) -> None:
    config = _folder(tmp_path / "exp")
    assert main(["run", str(config)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("Experiment seed "))
    seed = int(line.split()[2])
    assert f"--set reproducibility.experiment_seed={seed}" in line
    first = json.loads((config.parent / "seen.json").read_text())
    assert 0 <= first["seed"] < 2**31  # get_trial_seed() works: a seed of Determined's range

    described = _describe(capsys, 1)
    assert described["config"]["reproducibility"]["experiment_seed"] == seed
    assert described["trials"][0]["seed"] == first["seed"]

    # The printed seed repeats the run: the same trial seed, so the same initial weights.
    sys.modules.pop("model_def", None)
    assert main(["run", str(config), "--set", f"reproducibility.experiment_seed={seed}"]) == 0
    assert "Experiment seed" not in capsys.readouterr().out  # given, not drawn
    assert json.loads((config.parent / "seen.json").read_text()) == first

    # Another experiment without a seed draws another one (and other weights).
    sys.modules.pop("model_def", None)
    assert main(["run", str(config)]) == 0
    assert json.loads((config.parent / "seen.json").read_text())["seed"] != first["seed"]


def test_a_refused_run_prints_no_drawn_seed(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], fresh_imports: None
) -> None:
    # The seed is announced once the run's checks pass: a refusal is its only output.
    config = _folder(tmp_path / "exp")
    assert main(["run", str(config), "--set", "searcher.max_length=null"]) == 2
    captured = capsys.readouterr()
    assert "searcher.max_length: required" in captured.err
    assert "Experiment seed" not in captured.out + captured.err


# ----- the startup hook --------------------------------------------------------------------


def test_startup_hook_runs_before_the_trial_and_its_exports_reach_it(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], fresh_imports: None
) -> None:
    hook = """
        echo preparing data
        mkdir -p data && echo 5 > data/n.txt
        export HOOK_VALUE=from-the-hook
    """
    config = _folder(tmp_path / "exp", hook=hook, reproducibility={"experiment_seed": 1})
    model_def = config.parent / "model_def.py"
    model_def.write_text(
        model_def.read_text().replace(
            '        with open("seen.json", "w") as f:',
            "        import os\n"
            "        assert open('data/n.txt').read() == '5\\n'\n"
            "        assert os.environ['HOOK_VALUE'] == 'from-the-hook'\n"
            '        with open("seen.json", "w") as f:',
        )
    )
    assert main(["run", str(config)]) == 0
    assert (config.parent / "seen.json").is_file()
    assert "HOOK_VALUE" not in os.environ  # the runner's own environment is left as it was
    log = (
        tmp_path / "xdg" / "lightning-bridge" / "experiments" / "1" / "trials" / "1" / "trial.log"
    ).read_text()
    # Its commands (set -x) and their output, in the trial's log, before the training.
    assert "startup-hook.sh: ++ echo preparing data" in log
    assert "startup-hook.sh: preparing data" in log
    assert log.index("preparing data") < log.index("GPU available")


def test_startup_hook_runs_with_the_bridges_interpreter_first_on_path(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    fresh_imports: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As in an activated virtual environment: the hook's python3 and pip are the bridge's
    # interpreter's, whatever the user's PATH says; the trial keeps the user's PATH.
    user_path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if p != os.path.dirname(sys.executable)
    )
    monkeypatch.setenv("PATH", user_path)
    hook = """
        echo "$PATH" > hook-path.txt
        python3 -c "import sys; print(sys.prefix)" > hook-prefix.txt
    """
    config = _folder(tmp_path / "exp", hook=hook, reproducibility={"experiment_seed": 1})
    model_def = config.parent / "model_def.py"
    model_def.write_text(
        model_def.read_text().replace(
            '        with open("seen.json", "w") as f:',
            "        import os\n"
            "        open('trial-path.txt', 'w').write(os.environ['PATH'])\n"
            '        with open("seen.json", "w") as f:',
        )
    )
    assert main(["run", str(config)]) == 0
    hook_path = (config.parent / "hook-path.txt").read_text().strip().split(os.pathsep)
    assert hook_path == [os.path.dirname(sys.executable), *user_path.split(os.pathsep)]
    assert (config.parent / "hook-prefix.txt").read_text().strip() == sys.prefix
    assert (config.parent / "trial-path.txt").read_text() == user_path


def test_a_failing_startup_hook_stops_the_trial_with_its_exit_code(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], fresh_imports: None
) -> None:
    hook = """
        echo fetching
        false || (echo download failed >&2; exit 7)
        echo never reached
    """
    config = _folder(tmp_path / "exp", hook=hook, reproducibility={"experiment_seed": 1})
    assert main(["run", str(config)]) == 7
    err = capsys.readouterr().err
    assert "startup-hook.sh failed with exit code 7" in err
    assert "download failed" in err and "never reached" not in err
    assert not (config.parent / "seen.json").exists()  # the trial did not start
    trial = _describe(capsys, 1)["trials"][0]
    assert trial["state"] == "ERROR" and "exit code 7" in trial["message"]


def test_initial_weights_follow_the_trial_seed(tmp_path: pathlib.Path) -> None:
    """`init()` under the runner seeds with the trial's seed (not the experiment seed)."""
    from lightning_bridge.translation.services._run_description import RunDescription

    path = tmp_path / "run.json"
    RunDescription(
        trial_seed=12345, hparams={"global_batch_size": 4}, config=dict(SEEDED_CONFIG)
    ).write(path)
    os.environ["LIGHTNING_BRIDGE_EXPERIMENT"] = str(path)
    try:
        with lightning_bridge.init() as ctx:
            drawn = torch.rand(3)
            assert ctx.get_trial_seed() == 12345
    finally:
        del os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]
    torch.manual_seed(12345)
    torch.testing.assert_close(drawn, torch.rand(3), rtol=0, atol=0)


def test_a_script_that_configures_logging_gets_the_bridges_records_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`logging.basicConfig(format=det.LOG_FORMAT)` as Determined's examples start: the
    bridge's records are printed once, in the script's format (not also in the bridge's)."""
    from lightning_bridge import _logging

    _logging.configure()
    bridge = logging.getLogger("lightning_bridge")
    bridge.info("before")
    assert capsys.readouterr().err == "lightning-bridge: INFO: before\n"
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_import_map.LOG_FORMAT))
    root.addHandler(handler)
    try:
        bridge.info("after")
    finally:
        root.removeHandler(handler)
    assert capsys.readouterr().err == f"INFO: [{os.getpid()}] lightning_bridge: after\n"


class _PrivateReader(LinearTrial):
    """Reads Determined's private context attributes where Determined's fixtures, examples
    and model_hub read them: in `__init__`, while building the loaders, in `train_batch`."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.seen: dict[str, Any] = {"init": self._read()}

    def _read(self) -> dict[str, Any]:
        ctx = self.context
        return {
            "_aggregation_frequency": ctx._aggregation_frequency,
            "_epoch_len": ctx._epoch_len,
            "_current_batch_idx": ctx._current_batch_idx,
            "_use_apex": ctx._use_apex,
            "_is_chief": ctx.distributed._is_chief,
            "_is_local_chief": ctx.distributed._is_local_chief,
        }

    def build_training_data_loader(self) -> Any:
        self.seen["train_loader"] = self._read()
        return super().build_training_data_loader()

    def build_validation_data_loader(self) -> Any:
        self.seen["validation_loader"] = self._read()
        return super().build_validation_data_loader()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        self.seen[f"batch {batch_idx}"] = self._read()
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_determineds_private_context_attributes_keep_determineds_values() -> None:
    """Determined's values (determined 0.38.1's PyTorchTrialContext): the aggregation
    frequency given to init(); the batches per epoch from when the training loader is built
    (None before); the batch being trained (None before the first); no apex; one process is
    its machine's chief. Each is listed in `DETERMINED_PRIVATE_NAMES`."""
    from lightning_bridge.contract._determined_private import DETERMINED_PRIVATE_NAMES

    trial, _ = fit(
        _PrivateReader,
        init_kwargs={"aggregation_frequency": 2, "hparams": {"global_batch_size": 8}},
        max_length=lightning_bridge.Batch(6),
        checkpoint_policy="none",
    )
    flags = {"_use_apex": False, "_is_chief": True, "_is_local_chief": True}
    before = {"_aggregation_frequency": 2, "_epoch_len": None, "_current_batch_idx": None}
    assert trial.seen["init"] == trial.seen["train_loader"] == {**before, **flags}
    # 32 records in batches of 8: 4 batches per epoch, known once the training loader is.
    assert trial.seen["validation_loader"] == {**before, "_epoch_len": 4, **flags}
    for idx in range(6):
        assert trial.seen[f"batch {idx}"] == {
            **before,
            "_epoch_len": 4,
            "_current_batch_idx": idx,
            **flags,
        }
    assert {name.split(".")[-1] for name in DETERMINED_PRIVATE_NAMES} >= set(before) | set(flags)
    with pytest.raises(lightning_bridge.InvalidTrialError, match="read-only: pass aggregation"):
        trial.context._aggregation_frequency = 1
