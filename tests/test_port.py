"""`lightning-bridge port`: a LightningModule (and DataModule) becomes a trial folder that trains.

Each test writes a small Lightning project into its own folder under module names of its own
(`tinyN`), so modules imported by one test never answer another test's imports.
"""

from __future__ import annotations

import importlib
import itertools
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import lightning_bridge
from lightning_bridge import InvalidArgumentError, InvalidTrialError
from lightning_bridge.port._write import write_trial_folder

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ported"
GENERATED = ("model_def.py", "const.yaml", "startup-hook.sh")
_counter = itertools.count()

MODULE = """
import lightning.pytorch as pl
import torch
from torch import nn


class TinyModule(pl.LightningModule):
    def __init__(
        self,
        hidden: int = 8,
        lr: float = 0.1,
        activation: nn.Module = nn.Tanh(),
        widths: tuple = (3, 4),
    ):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), activation, nn.Linear(hidden, 1))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        error = nn.functional.mse_loss(self.net(x), y)
        {validation_logs}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)
"""

DATAMODULE = """
import lightning.pytorch as pl
import pytest  # a third-party import: the startup hook installs it
import torch
from torch.utils.data import DataLoader, TensorDataset

from {helper} import line_data


class TinyData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 4, samples: int = 32, hidden: int = 8):
        super().__init__()
        self.batch_size = batch_size
        self.samples = samples

    def train_dataloader(self):
        return DataLoader(line_data(self.samples, 0), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(line_data(self.samples // 2, 1), batch_size=self.batch_size)
"""

HELPER = """
import torch
from torch.utils.data import TensorDataset


def line_data(count, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 2, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) * 0.5 + 0.1)
"""

LOG_ERROR_FIRST = 'self.log("val_error", error)\n        self.log("val_accuracy", 1 - error)'
LOG_ACCURACY_FIRST = 'self.log("val_accuracy", 1 - error)\n        self.log("val_error", error)'


class Project:
    """A Lightning project in a folder: module, data module and a helper the data imports."""

    def __init__(self, folder: pathlib.Path, validation_logs: str = LOG_ERROR_FIRST) -> None:
        n = next(_counter)
        self.folder = folder
        self.model, self.data, self.helper = f"tiny{n}_model", f"tiny{n}_data", f"tiny{n}_help"
        folder.mkdir(parents=True, exist_ok=True)
        self.write(self.model, MODULE.format(validation_logs=validation_logs))
        self.write(self.data, DATAMODULE.format(helper=self.helper))
        self.write(self.helper, HELPER)

    def write(self, name: str, source: str) -> None:
        (self.folder / f"{name}.py").write_text(textwrap.dedent(source).lstrip())

    @property
    def target(self) -> str:
        return f"{self.model}:TinyModule"

    @property
    def datamodule(self) -> str:
        return f"{self.data}:TinyData"


@pytest.fixture
def project(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """A project in `tmp_path / "project"`, the working directory (where port imports from)."""
    before = set(sys.modules)
    proj = Project(tmp_path / "project")
    monkeypatch.chdir(proj.folder)
    yield proj
    for name in set(sys.modules) - before:
        if name.startswith(("tiny", "model_def")):
            del sys.modules[name]


def run_cli(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "lightning_bridge", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def read_config(folder: pathlib.Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "const.yaml").read_text())


@pytest.mark.slow  # a subprocess of its own
def test_port_writes_a_folder_that_trains_on_its_own(
    project: Project, tmp_path: pathlib.Path
) -> None:
    result = run_cli(
        "port", project.target, "--datamodule", project.datamodule, "--out", "../trial",
        cwd=project.folder,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "trial"

    # The user's sources are copied unchanged, including the helper the data module imports.
    copied = {p.name for p in out.iterdir()} - set(GENERATED)
    assert copied == {f"{project.model}.py", f"{project.data}.py", f"{project.helper}.py"}
    for name in copied:
        assert (out / name).read_bytes() == (project.folder / name).read_bytes()

    # model_def.py imports the classes by their import path and holds none of their code.
    model_def = (out / "model_def.py").read_text()
    assert f"from {project.model} import TinyModule" in model_def
    assert f"from {project.data} import TinyData" in model_def
    assert "class TinyModuleTrial(_PortedTrial):" in model_def
    assert "def validation_step" not in model_def and "nn.Linear" not in model_def

    config = read_config(out)
    assert config["entrypoint"] == "model_def:TinyModuleTrial"
    # Defaults of both constructors; batch_size became global_batch_size; the module's
    # activation (an nn.Module) is not plain data and is left to its default.
    assert config["hyperparameters"] == {
        "global_batch_size": 4,
        "hidden": 8,
        "lr": 0.1,
        "widths": [3, 4],
        "samples": 32,
    }
    assert "TinyModule.activation" in (out / "const.yaml").read_text()
    assert config["searcher"] == {
        "name": "single",
        "metric": "val_error",
        "smaller_is_better": True,
        "max_length": {"epochs": 10},
    }
    assert config["min_validation_period"] == {"epochs": 1}

    hook = out / "startup-hook.sh"
    assert os.access(hook, os.X_OK)
    lines = hook.read_text().splitlines()
    # The bridge only where the trial's python3 lacks it; the sources' packages with its pip.
    assert lines[-3:] == [
        'python3 -c "import lightning_bridge" 2>/dev/null ||',
        f'    python3 -m pip install "lightning-bridge=={lightning_bridge.__version__}"',
        "python3 -m pip install pytest",
    ]

    # The folder alone trains: run from elsewhere, the project folder is not importable.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = run_cli("run", str(out / "const.yaml"), "--test", cwd=elsewhere)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "val_error" in run.stdout and "val_accuracy" in run.stdout


def test_searcher_metric_is_the_first_one_logged(tmp_path: pathlib.Path) -> None:
    before = set(sys.modules)
    proj = Project(tmp_path / "project", validation_logs=LOG_ACCURACY_FIRST)
    old = os.getcwd()
    os.chdir(proj.folder)
    try:
        write_trial_folder(proj.target, tmp_path / "out", datamodule=proj.datamodule)
    finally:
        os.chdir(old)
        for name in set(sys.modules) - before:
            if name.startswith("tiny"):
                del sys.modules[name]
    searcher = read_config(tmp_path / "out")["searcher"]
    assert searcher["metric"] == "val_accuracy"
    assert searcher["smaller_is_better"] is False


def test_out_dir_is_not_overwritten_without_force(project: Project, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "const.yaml").write_text("name: mine\n")
    with pytest.raises(InvalidArgumentError, match=r"--out .* is not empty.*--force"):
        write_trial_folder(project.target, out, datamodule=project.datamodule)
    assert (out / "const.yaml").read_text() == "name: mine\n"
    assert sorted(p.name for p in out.iterdir()) == ["const.yaml", "notes.txt"]

    write_trial_folder(project.target, out, datamodule=project.datamodule, force=True)
    assert read_config(out)["entrypoint"] == "model_def:TinyModuleTrial"
    assert (out / "notes.txt").read_text() == "mine"

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        write_trial_folder(project.target, a_file, datamodule=project.datamodule, force=True)


@pytest.mark.slow  # a subprocess of its own
def test_cli_reports_a_bad_target_in_one_line(project: Project) -> None:
    result = run_cli("port", f"{project.model}:Missing", "--out", "out", cwd=project.folder)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"lightning-bridge: error: TARGET {project.model}:Missing: module {project.model!r} "
        "has no 'Missing'. Its LightningModule classes: TinyModule."
    ]
    assert not (project.folder / "out").exists()


BAD_MODULES = {
    "raises": "raise RuntimeError('boom at import')",
    "needs_dep": "import not_installed_dependency_xyz",
    "not_a_class": "def build():\n    return None",
    "bad_callback": """
        import lightning.pytorch as pl
        import torch
        from lightning.pytorch.callbacks import ModelPruning
        from torch.utils.data import DataLoader, TensorDataset

        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_callbacks(self):
                return [ModelPruning("l1_unstructured")]

            def train_dataloader(self):
                return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
        """,
    "fails_in_validation": """
        import lightning.pytorch as pl
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        class Model(pl.LightningModule):
            def validation_step(self, batch, batch_idx):
                raise ValueError("shape mismatch in validation")

            def train_dataloader(self):
                return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)

            def val_dataloader(self):
                return DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
        """,
}


@pytest.mark.parametrize(
    ("case", "target", "datamodule", "error", "message"),
    [
        ("", "tiny_model_only", None, InvalidArgumentError, r"not of the form module:Class"),
        ("", "no_such_module_xyz:Model", None, InvalidArgumentError,
         r"no module named 'no_such_module_xyz' on the import path\. Run port from the folder"),
        ("raises", "{m}:Model", None, InvalidArgumentError,
         r"importing '{m}' failed: RuntimeError: boom at import"),
        ("needs_dep", "{m}:Model", None, InvalidArgumentError,
         r"importing '{m}' failed: No module named 'not_installed_dependency_xyz'\. Install"),
        ("not_a_class", "{m}:build", None, InvalidTrialError,
         r"is a function, not a LightningModule subclass"),
        ("", "{data}:TinyData", None, InvalidTrialError,
         r"is the class TinyData, not a LightningModule subclass"),
        ("", "{target}", "{target}", InvalidTrialError,
         r"--datamodule .*TinyModule is the class TinyModule, not a LightningDataModule"),
        ("bad_callback", "{m}:Model", None, InvalidTrialError,
         r"ModelPruning is not supported by LightningAdapter: it changes the module's"),
        ("", "{target}", None, InvalidTrialError,
         r"has no train_dataloader\(\).*or pass --datamodule"),
        ("fails_in_validation", "{m}:Model", None, InvalidTrialError,
         r"validating one batch with Lightning failed: ValueError: shape mismatch"),
    ],
)  # fmt: skip
def test_bad_targets_fail_with_one_clear_message(
    project: Project,
    tmp_path: pathlib.Path,
    case: str,
    target: str,
    datamodule: str | None,
    error: type[Exception],
    message: str,
) -> None:
    module = f"{project.model}_{case}"
    if case:
        project.write(module, BAD_MODULES[case])
    names = {"m": module, "data": project.data, "target": project.target}
    out = tmp_path / "out"
    with pytest.raises(error, match=message.format(**names)):
        write_trial_folder(
            target.format(**names),
            out,
            datamodule=datamodule.format(**names) if datamodule else None,
        )
    assert not out.exists(), "nothing is written when the target is refused"


def test_a_module_named_model_def_is_refused(project: Project, tmp_path: pathlib.Path) -> None:
    sub = project.folder / f"pkg{next(_counter)}"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    (sub / "model_def.py").write_text(f"from {project.model} import TinyModule\n")
    # A package's own model_def module is fine: only a top-level one would clash.
    write_trial_folder(f"{sub.name}.model_def:TinyModule", tmp_path / "ok", project.datamodule)
    assert (tmp_path / "ok" / sub.name / "model_def.py").is_file()
    assert read_config(tmp_path / "ok")["entrypoint"] == "model_def:TinyModuleTrial"

    (project.folder / "model_def.py").write_text(f"from {project.model} import TinyModule\n")
    sys.modules.pop("model_def", None)
    with pytest.raises(InvalidArgumentError, match="clashes with the trial folder's own"):
        write_trial_folder("model_def:TinyModule", tmp_path / "clash", project.datamodule)


def test_checked_in_ported_example_is_what_port_writes_now(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sklearn", reason="the ported example's data module needs scikit-learn")
    saved = {name: sys.modules.pop(name) for name in ("data", "lit_model") if name in sys.modules}
    monkeypatch.chdir(EXAMPLE)
    try:
        out = write_trial_folder(
            "lit_model:LitClassifier", tmp_path / "out", datamodule="data:DigitsDataModule"
        )
    finally:
        for name in ("data", "lit_model"):
            sys.modules.pop(name, None)
        sys.modules.update(saved)
    assert sorted(p.name for p in out.iterdir()) == sorted([*GENERATED, "data.py", "lit_model.py"])
    for name in (*GENERATED, "data.py", "lit_model.py"):
        assert (out / name).read_text() == (EXAMPLE / name).read_text(), (
            f"examples/ported/{name} differs from what port writes now; regenerate it with "
            "`cd examples/ported && lightning-bridge port lit_model:LitClassifier "
            "--datamodule data:DigitsDataModule --out . --force`"
        )
    assert os.access(EXAMPLE / "startup-hook.sh", os.X_OK)


def _validation_history(api: Any, trial_cls: type, config: dict[str, Any]) -> list[dict]:
    """Train the ported trial for 6 batches with `api`'s Trainer; the validation metrics."""
    history: list[dict] = []

    class Record(api.PyTorchCallback):  # type: ignore[misc, name-defined]
        def on_validation_end(self, metrics: dict[str, Any]) -> None:
            history.append({k: float(v) for k, v in metrics.items()})

    class Recorded(trial_cls):  # type: ignore[misc, valid-type]
        def build_callbacks(self) -> dict[str, Any]:
            return {**super().build_callbacks(), "record": Record()}

    import random

    import numpy as np
    import torch

    with api.init(hparams=config["hyperparameters"], exp_conf=config) as context:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        api.Trainer(Recorded(context), context).fit(
            max_length=api.Batch(6), validation_period=api.Batch(3), checkpoint_policy="none"
        )
    return history


@pytest.mark.interop
def test_ported_folder_trains_the_same_on_determined_and_the_bridge(
    project: Project, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    det_pytorch = pytest.importorskip("determined.pytorch")
    out = write_trial_folder(project.target, tmp_path / "trial", datamodule=project.datamodule)
    # Determined's local mode copies the working directory: run from an empty one.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    monkeypatch.syspath_prepend(str(out))
    sys.modules.pop("model_def", None)
    model_def = importlib.import_module("model_def")
    # With Determined installed, the generated trial is built on Determined's own class.
    assert issubclass(model_def.TinyModuleTrial, det_pytorch.PyTorchTrial)
    config = read_config(out)

    on_determined = _validation_history(det_pytorch, model_def.TinyModuleTrial, config)
    on_bridge = _validation_history(lightning_bridge, model_def.TinyModuleTrial, config)
    assert (
        len(on_determined) == 2
        and [set(m) for m in on_determined] == [{"val_error", "val_accuracy"}] * 2
    )
    for det_metrics, bridge_metrics in zip(on_determined, on_bridge, strict=True):
        assert bridge_metrics == pytest.approx(det_metrics, rel=1e-5)


def test_installed_code_is_installed_by_the_hook_not_copied() -> None:
    from lightning_bridge.port._folder import Loaded
    from lightning_bridge.port._sources import _sources

    installed = importlib.import_module("_pytest.python")  # part of the pytest distribution
    bridge_dependency = importlib.import_module("lightning.pytorch.demos.boring_classes")
    assert _sources([Loaded("_pytest.python:Class", object, installed)]) == ([], ["pytest"])
    assert _sources([Loaded("x:BoringModel", object, bridge_dependency)]) == ([], [])


def test_a_distribution_installed_outside_site_packages_is_not_copied(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package installed with ``pip install --target`` into a folder on the path (as pip
    lays it out: the package and its dist-info RECORD) is installed by the hook, not copied."""
    from lightning_bridge.port._folder import Loaded
    from lightning_bridge.port._sources import _sources

    target = tmp_path / "target"
    (target / "targetpkg").mkdir(parents=True)
    (target / "targetpkg" / "__init__.py").write_text("class Model:\n    pass\n")
    info = target / "targetpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: targetpkg\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("targetpkg\n")
    (info / "RECORD").write_text(
        "targetpkg/__init__.py,,\ntargetpkg-1.0.dist-info/METADATA,,\n"
        "targetpkg-1.0.dist-info/RECORD,,\n"
    )
    monkeypatch.syspath_prepend(str(target))
    module = importlib.import_module("targetpkg")
    assert _sources([Loaded("targetpkg:Model", module.Model, module)]) == ([], ["targetpkg"])
    # The same folder without the distribution's record is the user's code: it is copied.
    sys.modules.pop("targetpkg")
    shutil.rmtree(info)
    module = importlib.import_module("targetpkg")
    copies, requirements = _sources([Loaded("targetpkg:Model", module.Model, module)])
    assert copies == [("targetpkg", target / "targetpkg")] and requirements == []


REAL_WORLD = """
import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


class Classifier(pl.LightningModule):
    # pytorch_lightning, ModelCheckpoint on val_acc.

    def __init__(self, lr: float = 0.1, batch_size: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.layer(x), y))
        self.log("val_acc", (self.layer(x).argmax(1) == y).float().mean())

    def configure_callbacks(self):
        return [pl.callbacks.ModelCheckpoint(monitor="val_acc", mode="max")]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        return DataLoader(data(16, 0), batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(data(8, 1), batch_size=self.hparams.batch_size)


class Pretrain(Classifier):
    # No validation: the searcher metric is the first value logged in training.

    validation_step = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        self.log("pretrain_loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_callbacks(self):
        return []


class QuietValidation(Pretrain):
    # validation_step logs nothing: the searcher metric is a training value.

    def validation_step(self, batch, batch_idx):
        self.layer(batch[0])


class NeedsClasses(Classifier):
    # Constructor arguments without defaults: written to const.yaml to fill in.

    def __init__(self, num_classes, width: int, lr: float = 0.1):
        super().__init__(lr=lr)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_error", F.cross_entropy(self.layer(x), y))
"""


@pytest.fixture
def real_world(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"tiny{next(_counter)}_real"
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(REAL_WORLD).lstrip())
    monkeypatch.chdir(folder)
    yield name
    for module in [m for m in sys.modules if m.startswith((name, "model_def"))]:
        del sys.modules[module]


def _train_folder(out: pathlib.Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Build the folder's trial and train it for two batches on the bridge."""
    sys.path.insert(0, str(out))
    try:
        sys.modules.pop("model_def", None)
        model_def = importlib.import_module("model_def")
        trial_cls = next(
            v for k, v in vars(model_def).items() if k.endswith("Trial") and k != "PyTorchTrial"
        )
        return _validation_history(lightning_bridge, trial_cls, config)
    finally:
        sys.path.remove(str(out))


def test_pytorch_lightning_module_with_model_checkpoint(
    real_world: str, tmp_path: pathlib.Path
) -> None:
    out = write_trial_folder(f"{real_world}:Classifier", tmp_path / "out")
    config = read_config(out)
    # ModelCheckpoint(monitor="val_acc", mode="max") is the searcher metric and the policy.
    assert config["searcher"]["metric"] == "val_acc"
    assert config["searcher"]["smaller_is_better"] is False
    assert config["checkpoint_policy"] == "best"
    assert "ModelCheckpoint's monitor and mode" in (out / "const.yaml").read_text()
    history = _train_folder(out, config)
    assert len(history) == 2 and "val_acc" in history[-1]


def test_module_without_validation_searches_on_a_training_value(
    real_world: str, tmp_path: pathlib.Path
) -> None:
    out = write_trial_folder(f"{real_world}:Pretrain", tmp_path / "out")
    config = read_config(out)
    assert config["searcher"]["metric"] == "pretrain_loss"
    assert "checkpoint_policy" not in config
    history = _train_folder(out, config)
    assert len(history) == 2 and "pretrain_loss" in history[-1]


def test_module_whose_validation_logs_nothing_searches_on_a_training_value(
    real_world: str, tmp_path: pathlib.Path
) -> None:
    out = write_trial_folder(f"{real_world}:QuietValidation", tmp_path / "out")
    config = read_config(out)
    assert config["searcher"]["metric"] == "pretrain_loss"
    # The trial validates, and reports the training values it has as validation metrics.
    history = _train_folder(out, config)
    assert len(history) == 2 and "pretrain_loss" in history[-1]


def test_arguments_without_defaults_are_written_to_fill_in(
    real_world: str, tmp_path: pathlib.Path
) -> None:
    out = write_trial_folder(f"{real_world}:NeedsClasses", tmp_path / "out")
    text = (out / "const.yaml").read_text()
    config = yaml.safe_load(text)
    # batch_size's default (4, of the parent's constructor) is not visible: to fill in too.
    assert config["hyperparameters"] == {
        "global_batch_size": None,
        "num_classes": None,
        "width": None,
        "lr": 0.1,
    }
    assert "  num_classes: null  # fill in: NeedsClasses.num_classes has no default" in text
    assert "  width: null  # fill in: NeedsClasses.width has no default" in text
    # Nothing could run: the metric is read from validation_step's source, to be checked.
    assert config["searcher"]["metric"] == "val_error"
    assert "read from the source" in text
    # The trial refuses to start until the values are filled in.
    with lightning_bridge.init(hparams=config["hyperparameters"]) as ctx:
        sys.path.insert(0, str(out))
        try:
            sys.modules.pop("model_def", None)
            trial_cls = importlib.import_module("model_def").NeedsClassesTrial
            with pytest.raises(InvalidTrialError, match=r"'num_classes', 'width' without a"):
                trial_cls(ctx)
        finally:
            sys.path.remove(str(out))


def _dependencies_view(root: pathlib.Path) -> list[pathlib.Path]:
    """Folders holding this interpreter's third-party packages without the bridge itself: its
    site-packages as a folder of links (the bridge's own entries, pip and `.pth`
    files left out) and the folders other `.pth` files put on `sys.path` (a shared folder)."""
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    view = root / "site-view"
    view.mkdir()
    skip = ("lightning_bridge", "__editable__", "pip")
    for entry in purelib.iterdir():
        name = entry.name.lower().replace("-", "_")
        if name.endswith(".pth") or name.startswith(skip) or name == "__pycache__":
            continue
        (view / entry.name).symlink_to(entry)
    folders = [view]
    base = pathlib.Path(sys.base_prefix).resolve()
    for item in sys.path:
        path = pathlib.Path(item).resolve() if item else None
        if path is None or not path.is_dir() or path == purelib.resolve():
            continue
        if path.is_relative_to(base):
            continue  # the standard library
        if (path / "lightning_bridge").exists():
            continue  # this checkout (PYTHONPATH, pytest's rootdir); the shared folder of
            # the test sessions may lie inside it (.nox/_shared) and is kept
        folders.append(path)
    return folders


@pytest.mark.slow  # a virtual environment, the package built and installed, a run
def test_a_ported_folder_runs_in_a_fresh_virtual_environment(tmp_path: pathlib.Path) -> None:
    """The package installed from this checkout into a new virtual environment (its
    dependencies reach it through a `.pth` file: nothing downloaded), the example ported with
    that environment's `lightning-bridge`, and the folder run with it, not activated: the
    startup hook's `python3` is the environment's, which has the bridge, so the hook installs
    nothing (no index is reachable) and the trial trains."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = pathlib.Path(
        subprocess.run(
            [python, "-c", purelib], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    # The environment's own setuptools (the one ensurepip bundles, without `bdist_wheel`)
    # gives way to the current one of the dependencies.
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", "setuptools"], check=True)
    (site / "_dependencies.pth").write_text("".join(f"{p}\n" for p in _dependencies_view(tmp_path)))
    # The package's own files, built and installed as pip installs a checkout.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "lightning_bridge", source / "lightning_bridge",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env = {k: v for k, v in env.items() if not k.startswith("LIGHTNING_BRIDGE_")}
    # A PATH without this interpreter's folder or the new environment's: whatever `pip` comes
    # first is not the environment's (the user did not activate it).
    here = {os.path.dirname(sys.executable), str(venv / "bin")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p not in here
    )
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", str(source)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run(
        [python, "-c", "import lightning_bridge; print(lightning_bridge.__file__)"],
        env=env, cwd=tmp_path, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert pathlib.Path(where.strip()).is_relative_to(site), where

    project = tmp_path / "project"
    project.mkdir()
    for name in ("lit_model.py", "data.py"):
        shutil.copy(EXAMPLE / name, project / name)
    bridge = str(venv / "bin" / "lightning-bridge")
    ported = subprocess.run(
        [bridge, "port", "lit_model:LitClassifier", "--datamodule", "data:DigitsDataModule",
         "--out", str(tmp_path / "trial")],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ported.returncode == 0, ported.stderr[-3000:]
    assert (tmp_path / "trial" / "startup-hook.sh").read_text() == (
        EXAMPLE / "startup-hook.sh"
    ).read_text()
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    run = subprocess.run(
        [bridge, "run", "const.yaml", "--test"],
        cwd=tmp_path / "trial", env=offline, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "val_accuracy" in run.stdout
    log = (tmp_path / "xdg/lightning-bridge/experiments/1/trials/1/trial.log").read_text()
    # The hook's python3 was the environment's: it imports the bridge, and installs nothing.
    assert "+ python3 -c 'import lightning_bridge'" in log
    assert "Requirement already satisfied: scikit-learn" in log
    assert "install lightning-bridge" not in log
