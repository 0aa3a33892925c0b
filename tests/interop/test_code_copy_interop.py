"""A checkpoint written from the Python API (`Trainer.fit` in a script of one's own) carries
the working directory in `code/`, as determined==0.38.1's local mode writes it: `.detignore`
honoured, bytecode left out. The bridge also leaves out what the run writes there (its
checkpoint directory, by default inside the working directory; TensorBoard logs), which
Determined's copy takes in when they are there (its `runs/` of TensorBoard events).

The same folder is trained by each, in a process of its own, and the files of the last
checkpoint's `code/` are compared.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.interop
pytest.importorskip("determined.pytorch")

REPO = pathlib.Path(__file__).resolve().parents[2]

FIT = """
import sys

import torch

if sys.argv[1] == "determined":
    import determined.pytorch as pytorch
else:
    import lightning_bridge as pytorch

from pkg.util import SIZE


class Tiny(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(SIZE, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def build_training_data_loader(self):
        x = torch.randn(16, SIZE)
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), 4)

    def build_validation_data_loader(self):
        return self.build_training_data_loader()

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = torch.nn.functional.mse_loss(self.model(batch[0]), batch[1])
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(batch[0]), batch[1])}


with pytorch.init(hparams={"global_batch_size": 4}) as context:
    pytorch.Trainer(Tiny(context), context).fit(
        max_length=pytorch.Batch(4), checkpoint_period=pytorch.Batch(2)
    )
"""


def _folder(root: pathlib.Path) -> pathlib.Path:
    """A working directory with code, data and logs a .detignore leaves out, and bytecode."""
    root.mkdir()
    (root / "fit.py").write_text(FIT)
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text("SIZE = 3\n")
    (root / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"0" * 4096)
    (root / "notes.log").write_text("a log\n")
    (root / "README.md").write_text("notes\n")
    (root / ".detignore").write_text("data/\n*.log\n")
    return root


def _code_of_last_checkpoint(api: str, folder: pathlib.Path, data_home: pathlib.Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(data_home)}
    for var in ("LIGHTNING_BRIDGE_EXPERIMENT", "DET_MASTER", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(var, None)
    done = subprocess.run(
        [sys.executable, "fit.py", api], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = [p.parent for p in [*folder.rglob("code"), *data_home.rglob("code")]]
    checkpoints = sorted(
        {p for p in found if (p / "metadata.json").is_file()},
        key=lambda p: (p / "metadata.json").stat().st_mtime,
    )
    assert checkpoints, f"{api} wrote no checkpoint with code/"
    code = checkpoints[-1] / "code"
    return sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file())


def test_a_python_api_checkpoint_carries_the_working_directory_as_determined_does(
    tmp_path: pathlib.Path,
) -> None:
    reference = _code_of_last_checkpoint(
        "determined", _folder(tmp_path / "det"), tmp_path / "det-data"
    )
    got = _code_of_last_checkpoint("bridge", _folder(tmp_path / "bridge"), tmp_path / "br-data")
    # Determined's local mode writes TensorBoard events into runs/ of the working directory
    # and copies them with the code; the bridge leaves out what the run writes.
    written_by_the_run = [f for f in reference if f.startswith("runs/")]
    assert written_by_the_run
    code = [f for f in reference if f not in written_by_the_run]
    assert code == ["README.md", "fit.py", "pkg/__init__.py", "pkg/util.py"]
    assert got == code
