"""What `lightning-bridge run --launcher local` does before the trial's first `train_batch`.

A tiny experiment folder (a 2->1 linear `PyTorchTrial`, four batches) is run with
`python -m lightning_bridge run const.yaml --launcher local`. Every Python process of the run
(the command and the trial's process it starts) is watched from its start by a
`sitecustomize` this script writes (`sys.setprofile` on the main thread) until some process of
the run reaches the trial's first `train_batch`. Counted per process: the config parses
(`parse_config`), the run description's writes and reads, and the package's modules entered.
Printed: each process, the totals, the package's modules entered in more than one process
(each such module is imported and run again) and those entered again from below while one of
their frames still runs (the path climbing back up: a command re-entering the command line).

    python bench/launch_path.py [--repo PATH]   # PATH: the checkout to measure (default: this)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

MODEL_DEF = """
from typing import Any

import torch

from determined import pytorch


class TinyTrial(pytorch.PyTorchTrial):
    def __init__(self, context: Any) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(2, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _loader(self, n: int) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(n, 2), torch.randn(n, 1))
        return pytorch.DataLoader(data, batch_size=2)

    def build_training_data_loader(self) -> Any:
        return self._loader(8)

    def build_validation_data_loader(self) -> Any:
        return self._loader(4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""

CONFIG = """\
entrypoint: model_def:TinyTrial
hyperparameters: {global_batch_size: 2}
searcher: {name: single, metric: validation_loss, max_length: {batches: 4}}
min_validation_period: {batches: 2}
reproducibility: {experiment_seed: 7}
"""

# Runs at the start of every Python process of the run (its folder is first on PYTHONPATH).
SITECUSTOMIZE = """
import json, os, sys

_out = os.environ.get("LAUNCH_PATH_OUT")
if _out:
    _first = os.path.join(_out, "first_batch")
    _seen = {"pid": os.getpid(), "argv": list(sys.argv), "modules": [], "parses": 0,
             "writes": 0, "reads": 0}
    _modules = set()
    _reentered = set()
    _packages = set()

    def _done():
        sys.setprofile(None)
        _seen["argv"] = list(sys.argv)
        _seen["modules"] = sorted(_modules)
        _seen["reentered"] = sorted(_reentered)
        _seen["packages"] = sorted(_packages)
        with open(os.path.join(_out, f"{os.getpid()}.json"), "w") as f:
            json.dump(_seen, f)

    def _profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_globals.get("__name__") or ""
        code = frame.f_code.co_name
        if code == "train_batch" and not name.startswith("lightning_bridge"):
            open(_first, "w").close()
            _done()
            return
        if not name.startswith("lightning_bridge"):
            return
        if os.path.exists(_first):  # another process of the run reached its first batch
            _done()
            return
        _modules.add(name)
        if frame.f_code.co_filename.endswith("__init__.py"):
            _packages.add(name)
        caller = frame.f_back
        by = caller.f_globals.get("__name__") or "" if caller is not None else ""
        if not code.startswith("<") and by != name and by.startswith("lightning_bridge"):
            up = caller.f_back
            while up is not None:  # entered again while one of its functions still runs
                if up.f_globals.get("__name__") == name and not up.f_code.co_name.startswith("<"):
                    _reentered.add(name)
                    break
                up = up.f_back
        if code == "parse_config" and name.endswith("_config"):
            _seen["parses"] += 1
        elif name.endswith("_run_description") and code in ("write", "read"):
            _seen[code + "s"] += 1

    import atexit
    atexit.register(lambda: None if sys.getprofile() is None else _done())
    sys.setprofile(_profile)
"""


def measure(repo: pathlib.Path) -> list[dict[str, object]]:
    """Run the tiny experiment with `repo` first on the path; each process's counts."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="launch_path."))
    folder, hook, out = root / "exp", root / "hook", root / "out"
    for path in (folder, hook, out):
        path.mkdir()
    (folder / "model_def.py").write_text(MODEL_DEF)
    (folder / "const.yaml").write_text(CONFIG)
    (hook / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = {
        **os.environ,
        "PYTHONPATH": f"{hook}{os.pathsep}{repo}",
        "LAUNCH_PATH_OUT": str(out),
        "XDG_DATA_HOME": str(root / "data"),
    }
    command = [sys.executable, "-m", "lightning_bridge", "run", "const.yaml", "--launcher", "local"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=pathlib.Path, default=pathlib.Path(__file__).parents[1])
    args = parser.parse_args()
    processes = measure(args.repo.resolve())
    counts: dict[str, int] = {}
    for seen in processes:
        argv = " ".join(str(a) for a in seen["argv"])  # type: ignore[attr-defined]
        modules = seen["modules"]
        print(
            f"process {argv[:70]}: {len(modules)} modules "  # type: ignore[arg-type]
            f"({len(seen['packages'])} of them packages' __init__), "  # type: ignore[arg-type]
            f"{seen['parses']} config parses, run description {seen['writes']} writes / "
            f"{seen['reads']} reads; re-entered from below: {', '.join(seen['reentered'])}"  # type: ignore[arg-type]
        )
        for name in modules:  # type: ignore[attr-defined]
            counts[name] = counts.get(name, 0) + 1
    twice = sorted(name for name, n in counts.items() if n > 1)
    total = {k: sum(int(s[k]) for s in processes) for k in ("parses", "writes", "reads")}  # type: ignore[call-overload]
    print(
        f"{len(processes)} processes; {len(counts)} modules; config parses {total['parses']}; "
        f"run description writes {total['writes']}, reads {total['reads']}; "
        f"{len(twice)} modules entered in more than one process"
    )
    print("\n".join(f"  {name}" for name in twice))


if __name__ == "__main__":
    main()
