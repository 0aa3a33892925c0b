"""Hugging Face Trainer scripts with Determined's `DetCallback` for `lightning-bridge run`, and
the folders that run them: shared by the bridge's tests and the parity test against
Determined's own callback.

No download: the model is a 2-layer GPT-2 built from a `GPT2Config` with random weights, the
data pre-tokenized token ids generated from a seed."""

from __future__ import annotations

import pathlib
from typing import Any

from tests._folders import GATE_CODE

# `python3 train.py TRAINING_ARGS`: a tiny GPT-2 trained by `transformers.Trainer` with
# `DetCallback`. The hyperparameters give `learning_rate` (into the training arguments, as
# Determined's examples do), `filter_metrics` / `user_data` (for the callback) and `gate` /
# `hold_at` (`GATE_CODE`: held before that step). Every process appends what it saw (the step
# it resumed from, its last step, its arguments' `resume_from_checkpoint`; with `--deepspeed
# CONFIG`, the ZeRO stage of the config it found through `get_ds_config_path_from_args` and its
# engine's) to `seen.<rank>.jsonl` in its run folder, and rank 0 saves the final weights there
# (`weights.<n>.pt`).
HF_TRAIN = (
    """
import json
import logging
import os
import pathlib
import sys

import torch
import transformers

import determined as det
from determined.transformers import DetCallback
"""
    + GATE_CODE
    + """

class Tokens(torch.utils.data.Dataset):
    # Pre-tokenized sequences: a repeating pattern the model can learn, from a seed.
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, 60, (n, 1), generator=g)
        self.ids = (start + torch.arange(16)) % 64

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Hold(transformers.TrainerCallback):
    def __init__(self, hparams):
        self.hparams = hparams

    def on_step_begin(self, args, state, control, **kwargs):
        hold_at_gate(self.hparams, state.global_step)


def main():
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "run it with lightning-bridge run"
    hp = info.trial.hparams
    ds_config = None
    if "--deepspeed" in sys.argv:
        # The DeepSpeed config the Trainer is given, found as Determined's examples find it.
        from determined.transformers import get_ds_config_path_from_args

        ds_config = get_ds_config_path_from_args(sys.argv)
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(sys.argv[1:])
    args.learning_rate = hp.get("learning_rate", args.learning_rate)
    args.report_to = ["tensorboard"]
    distributed = None
    if args.world_size > 1 and ds_config:
        distributed = det.core.DistributedContext.from_deepspeed()
    elif args.world_size > 1:
        distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        callback = DetCallback(
            core_context, args, filter_metrics=hp.get("filter_metrics"),
            user_data=hp.get("user_data"),
        )
        resumed_from = args.resume_from_checkpoint
        transformers.set_seed(args.seed)
        config = transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        )
        model = transformers.GPT2LMHeadModel(config)
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Tokens(64, 0), eval_dataset=Tokens(16, 1),
            callbacks=[callback, Hold(hp)],
        )
        result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        run_dir = pathlib.Path(os.environ["LIGHTNING_BRIDGE_EXPERIMENT"]).parent
        rank = args.process_index
        seen = {
            "resumed_from": None if resumed_from is None else pathlib.Path(resumed_from).name,
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
        }
        if ds_config:
            with open(ds_config) as f:
                stage = json.load(f)["zero_optimization"]["stage"]
            engine = trainer.model_wrapped
            seen.update(
                config_stage=stage, engine=type(engine).__name__,
                engine_stage=engine.zero_optimization_stage(),
            )
        with open(run_dir / f"seen.{rank}.jsonl", "a") as f:
            f.write(json.dumps(seen) + "\\n")
        if rank == 0:
            n = len(list(run_dir.glob("weights.*.pt")))
            torch.save(trainer.model.state_dict(), run_dir / f"weights.{n}.pt")


if __name__ == "__main__":
    main()
"""
)

# The Trainer's arguments every run starts with: 12 steps of 8 sequences, a log and an
# evaluation every 4, a save every 4 keeping 2, on the CPU.
TRAINING_ARGS = [
    "--max_steps", "12",
    "--per_device_train_batch_size", "8",
    "--per_device_eval_batch_size", "8",
    "--logging_strategy", "steps",
    "--logging_steps", "4",
    "--eval_strategy", "steps",
    "--eval_steps", "4",
    "--save_strategy", "steps",
    "--save_steps", "4",
    "--save_total_limit", "2",
    "--seed", "1337",
    "--use_cpu", "true",
    "--dataloader_num_workers", "0",
    "--disable_tqdm", "true",
]  # fmt: skip


def hf_folder(
    root: pathlib.Path,
    name: str = "exp",
    output_dir: pathlib.Path | None = None,
    args: list[str] | None = None,
    launcher: str = "",
    **config: Any,
) -> pathlib.Path:
    """An experiment folder running `HF_TRAIN` with `TRAINING_ARGS` (and `args` after them) and
    the Trainer's `output_dir` (`root/NAME-out` unless given): a single trial searching
    `eval_loss`, unless `config` changes it; the folder."""
    import yaml

    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(HF_TRAIN)
    out = output_dir or root / f"{name}-out"
    words = [*TRAINING_ARGS, *(args or []), "--output_dir", str(out)]
    conf: dict[str, Any] = {
        "name": "hf-trainer",
        "entrypoint": " ".join([launcher, "python3 train.py", *words]).strip(),
        "hyperparameters": {"learning_rate": 0.01},
        "searcher": {"name": "single", "metric": "eval_loss", "smaller_is_better": True},
        "max_restarts": 0,
    }
    for key, value in config.items():
        if key == "hyperparameters":
            conf["hyperparameters"].update(value)
        else:
            conf[key] = value
    (folder / "const.yaml").write_text(yaml.safe_dump(conf))
    return folder


# `python3 det_offcluster.py TRAINING_ARGS` beside `HF_TRAIN`'s `train.py`: the same script with
# Determined 0.38.1's own `determined.transformers.DetCallback`, off-cluster. The callback needs
# a trial's `ClusterInfo`, which only Determined's master hands out, so this sets one (from the
# JSON in `HF_PARITY_INFO`: hparams, config, checkpoint storage) where `get_cluster_info()`
# reads it, and `det.core.init()` is Determined's own off-cluster Core API (`_dummy_init`):
# reports are logged, checkpoints go to the storage folder.
DET_OFFCLUSTER = """
import json
import os
import runpy
import sys

import determined as det
from determined import _info

spec = json.loads(os.environ["HF_PARITY_INFO"])
trial = _info.TrialInfo(
    trial_id=1, experiment_id=1, trial_seed=0, hparams=spec["hparams"], config=spec["config"],
    steps_completed=0, trial_run_id=1, debug=False, inter_node_network_interface=None,
)
_info._info = _info.ClusterInfo(
    master_url="http://127.0.0.1:8080", cluster_id="off-cluster", agent_id="local",
    slot_ids=[0], task_id="1", allocation_id="1", session_token="", task_type="TRIAL",
    trial_info=trial,
)
offcluster = det.core._dummy_init
det.core.init = lambda **kw: offcluster(checkpoint_storage=spec["storage"], **kw)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""
