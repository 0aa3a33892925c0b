"""One rank of a two-process run of the same trial, on the reference or on the bridge.

Launched once per rank by ``torch.distributed.run``::

    python -m torch.distributed.run --nproc_per_node=2 -m tests.interop.ddp_script \\
        --api determined --workdir DIR --out PREFIX
    python -m torch.distributed.run --nproc_per_node=2 -m tests.interop.ddp_script \\
        --api lightning_bridge --launch auto --workdir DIR --out PREFIX

``--launch process_group`` (the default, and the only way the reference runs off-cluster) makes
the script create the gloo process group and pass ``DistributedContext.from_torch_distributed()``
to ``init()``; ``--launch auto`` leaves it to the bridge to detect torchrun.

Every rank writes ``PREFIX.<rank>.json``: the callback names, the metrics, the sample ids each
``train_batch`` received and the final weights, as seen by the trial on that rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from types import ModuleType
from typing import Any

import torch.distributed as dist

from .harness import load_api, run_trial
from .trials import Scenario, _fit_two_models, make_sgd_dropout_trial, make_two_models_trial

# 48 training samples = 6 global batches of 8 (4 per rank), 24 validation samples = 4 batches of
# 6 (2 per rank): every batch is full on both ranks, so neither side pads or drops anything.
N_TRAIN = 48
N_VAL = 24


def _fit_kwargs(pytorch: ModuleType) -> dict[str, Any]:
    # 18 batches in all; none of the periods divides the 6 batches of an epoch.
    return {
        "max_length": pytorch.Epoch(3),
        "validation_period": pytorch.Batch(4),
        "checkpoint_period": pytorch.Batch(7),
        "reporting_period": pytorch.Batch(5),
    }


SCENARIO = Scenario(
    name="ddp_sgd_dropout",
    description="SGD+momentum, per-batch LR schedule, shuffle, dropout, on two processes",
    make_trial=make_sgd_dropout_trial,
    fit_kwargs=_fit_kwargs,
    hparams={"global_batch_size": 8, "lr": 0.05},
    exp_conf={"data": {"n_train": N_TRAIN, "n_val": N_VAL}},
)

# Two models stepped separately, aggregation_frequency=2: Determined wraps each model in its own
# DistributedDataParallel, Lightning wraps the whole TrialModule once.
TWO_MODELS = Scenario(
    name="ddp_two_models",
    description="two models/optimizers, clip_grads, aggregation_frequency=2, on two processes",
    make_trial=make_two_models_trial,
    fit_kwargs=_fit_two_models,
    hparams={"global_batch_size": 8, "lr_a": 0.2, "lr_b": 0.02},
)
SCENARIOS = {"sgd_dropout": SCENARIO, "two_models": TWO_MODELS}
AGGREGATION = {"sgd_dropout": 1, "two_models": 2}


def _init_kwargs(api: str, launch: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if api == "lightning_bridge":
        kwargs["trainer_kwargs"] = {"enable_progress_bar": False, "enable_model_summary": False}
        if launch == "auto":
            return kwargs  # the bridge detects the torchrun launch by itself
    # The script owns the process group and hands its context to init(), as off-cluster
    # Determined scripts do.
    dist.init_process_group("gloo")
    if api == "determined":
        import determined as det

        # The reference's trial controller refuses several processes unless told that
        # torch.distributed is the backend in use.
        os.environ["USE_TORCH_DISTRIBUTED"] = "1"
        kwargs["distributed"] = det.core.DistributedContext.from_torch_distributed()
    else:
        import lightning_bridge

        kwargs["distributed"] = lightning_bridge.DistributedContext.from_torch_distributed()
    return kwargs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=["determined", "lightning_bridge"], required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--launch", choices=["auto", "process_group"], default="process_group")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="sgd_dropout")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    init_kwargs = _init_kwargs(args.api, args.launch)
    init_kwargs["aggregation_frequency"] = AGGREGATION[args.scenario]
    scenario = dataclasses.replace(SCENARIOS[args.scenario], init_kwargs=init_kwargs)
    record = run_trial(load_api(args.api), scenario, args.workdir)
    summary = record.summary()
    summary["train_ids"] = [call["ids"] for call in record.trial_calls("train_batch")]
    summary["eval_ids"] = [call["ids"] for call in record.trial_calls("evaluate_batch")]
    summary["rank"] = rank
    summary["state_dict_keys"] = {name: list(weights) for name, weights in record.weights.items()}
    with open(f"{args.out}.{rank}.json", "w") as f:
        json.dump(summary, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
