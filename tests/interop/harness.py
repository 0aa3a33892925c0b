"""Run one scenario on one API (the reference ``determined.pytorch`` or ``lightning_bridge``).

Usable as a script for debugging::

    python -m tests.interop.harness --api determined --scenario sgd_dropout
    python -m tests.interop.harness --api lightning_bridge --scenario reducers --events
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import random
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import torch

from .recording import Event, Recorder, list_files
from .trials import SCENARIOS, Scenario

API_MODULES = {"determined": "determined.pytorch", "lightning_bridge": "lightning_bridge"}


@dataclasses.dataclass
class RunRecord:
    """Everything observed during one ``fit()``."""

    api: str
    scenario: str
    events: list[Event]
    weights: dict[str, dict[str, np.ndarray]]
    final_lrs: dict[str, list[float]]
    # Per checkpoint (in on_checkpoint_write_end order): the files of its directory once fit()
    # returned, the files present when on_checkpoint_write_end ran, and where the directory is
    # (its parent relative to the user data directory, or "<elsewhere>") and whether its name
    # is the uuid given to on_checkpoint_upload_end.
    checkpoint_files: list[list[str]]
    files_at_write_end: list[list[str]]
    checkpoint_locations: list[dict[str, Any]]
    counters: dict[str, int]

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e["kind"] in kinds]

    @property
    def hooks(self) -> list[Event]:
        """Every ``PyTorchCallback`` call, in order."""
        return self.of_kind("hook")

    def hook_args(self, name: str) -> list[dict[str, Any]]:
        return [e["args"] for e in self.hooks if e["name"] == name]

    @property
    def training_metrics(self) -> list[dict[str, Any]]:
        """``avg_metrics`` of each ``on_training_workload_end``."""
        return [a["avg_metrics"] for a in self.hook_args("on_training_workload_end")]

    @property
    def validation_metrics(self) -> list[dict[str, Any]]:
        """The metrics passed to each ``on_validation_end``."""
        return [a["metrics"] for a in self.hook_args("on_validation_end")]

    def trial_calls(self, name: str) -> list[dict[str, Any]]:
        return [e["args"] for e in self.events if e["kind"] == "trial" and e["name"] == name]

    @property
    def train_indices(self) -> list[tuple[int, int]]:
        """``(batch_idx, epoch_idx)`` received by each ``train_batch``."""
        return [(a["batch_idx"], a["epoch_idx"]) for a in self.trial_calls("train_batch")]

    def summary(self, with_events: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "api": self.api,
            "scenario": self.scenario,
            "hook_names": [e["name"] for e in self.hooks],
            "train_indices": self.train_indices,
            "training_metrics": self.training_metrics,
            "validation_metrics": self.validation_metrics,
            "final_lrs": self.final_lrs,
            "weights": {
                m: {k: v.tolist() for k, v in sd.items()} for m, sd in self.weights.items()
            },
            "checkpoint_files": self.checkpoint_files,
            "files_at_write_end": self.files_at_write_end,
            "checkpoint_locations": self.checkpoint_locations,
            "counters": self.counters,
        }
        if with_events:
            out["events"] = self.events
        return out


def load_api(api: str) -> ModuleType:
    """Import the API module for ``api`` ("determined" or "lightning_bridge")."""
    return importlib.import_module(API_MODULES.get(api, api))


def api_name(pytorch: ModuleType) -> str:
    return "determined" if pytorch.__name__.startswith("determined") else pytorch.__name__


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def isolated_environment(workdir: pathlib.Path) -> Iterator[None]:
    """Run with cwd and the user data directory inside ``workdir``; restore both afterwards.

    The reference stores local checkpoints under the user data directory (``XDG_DATA_HOME``),
    and loggers write relative to the working directory.
    """
    cwd = workdir / "cwd"
    data = workdir / "xdg_data"
    cwd.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    old_cwd = os.getcwd()
    old_xdg = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(data)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        if old_xdg is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = old_xdg


def run_trial(
    pytorch: ModuleType,
    scenario: Scenario | str,
    workdir: str | os.PathLike[str],
    trial_api: ModuleType | None = None,
) -> RunRecord:
    """Run ``scenario`` with the API module ``pytorch`` and record what the trial observed.

    ``trial_api`` (default ``pytorch``) is the module the trial's classes, enums and
    ``fit()`` units come from: Determined's with the bridge's ``init`` / ``Trainer`` is how
    unchanged Determined code runs where ``determined`` is installed.
    """
    if isinstance(scenario, str):
        scenario = SCENARIOS[scenario]
    trial_api = pytorch if trial_api is None else trial_api
    workdir = pathlib.Path(workdir)
    recorder = Recorder()
    trial_cls = scenario.make_trial(trial_api, recorder)
    with isolated_environment(workdir):
        seed_everything(scenario.seed)
        with pytorch.init(
            hparams=dict(scenario.hparams),
            exp_conf=None if scenario.exp_conf is None else dict(scenario.exp_conf),
            **scenario.init_kwargs,
        ) as context:
            trial = trial_cls(context)
            trainer = pytorch.Trainer(trial, context)
            trainer.fit(**scenario.fit_kwargs(trial_api))
            if scenario.init_kwargs.get("enable_tensorboard_logging", True):
                # Flush and close the trainer's TensorBoard writer while the working directory
                # it may have been opened relative to still exists.
                context.get_tensorboard_writer().close()
            weights, final_lrs = final_state(trial)
        return run_record(api_name(pytorch), scenario.name, recorder, weights, final_lrs)


def final_state(trial: Any) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]]]:
    """A trained trial's weights (numpy copies) and final learning rates, by name."""
    weights = {
        name: {k: v.detach().cpu().numpy().copy() for k, v in m.state_dict().items()}
        for name, m in trial.models_by_name.items()
    }
    final_lrs = {
        name: [float(g["lr"]) for g in opt.param_groups]
        for name, opt in trial.optimizers_by_name.items()
    }
    return weights, final_lrs


def run_record(
    api: str,
    scenario: str,
    recorder: Recorder,
    weights: dict[str, dict[str, Any]],
    final_lrs: dict[str, list[float]],
) -> RunRecord:
    """What a run left, read in its isolated environment: the recorder's events and the
    checkpoints' files and locations, with the trial's final state."""
    checkpoint_files = [list_files(d) if os.path.isdir(d) else [] for d in recorder.checkpoint_dirs]
    checkpoint_locations = [
        _location(d, recorder.checkpoint_uuids) for d in recorder.checkpoint_dirs
    ]
    return RunRecord(
        api=api,
        scenario=scenario,
        events=recorder.events,
        weights=weights,
        final_lrs=final_lrs,
        checkpoint_files=checkpoint_files,
        files_at_write_end=recorder.files_at_write_end,
        checkpoint_locations=checkpoint_locations,
        counters=dict(recorder.counters),
    )


def _location(checkpoint_dir: str, uuids: list[str]) -> dict[str, Any]:
    data_home = pathlib.Path(os.environ["XDG_DATA_HOME"]).resolve()
    path = pathlib.Path(checkpoint_dir).resolve()
    try:
        parent = str(path.parent.relative_to(data_home))
    except ValueError:
        parent = "<elsewhere>"
    return {"parent": parent, "named_by_uuid": path.name in uuids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="determined", help="determined or lightning_bridge")
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--events", action="store_true", help="include the full event list")
    args = parser.parse_args(argv)
    pytorch = load_api(args.api)
    with tempfile.TemporaryDirectory() as tmp:
        record = run_trial(pytorch, args.scenario, tmp)
    json.dump(record.summary(with_events=args.events), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
