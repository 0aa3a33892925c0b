"""Determined's `determined.transformers`: `DetCallback` for Hugging Face's `transformers.Trainer`,
on the bridge's Core API.

A script that trains with `Trainer` and `DetCallback(core_context, training_args, ...)` runs
under `lightning-bridge run` as on a Determined cluster: the Trainer's logs become the trial's
training and validation metrics (`train_` / `eval_` names, the group chosen by
`get_metric_type`), each checkpoint folder the Trainer writes is uploaded to the experiment's
storage (every process its shard, with `runs/`, TensorBoard's folder), the trial's latest
checkpoint is downloaded into `output_dir` and becomes `resume_from_checkpoint`, and a pause or
a search's stop (`should_preempt()`) ends training with a final save. The Trainer does the
training, the saving and the resuming; this only connects its callback hooks to the Core API.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from lightning_bridge.core._context import Context
from lightning_bridge.translation.services._cluster_info import ClusterInfo, get_cluster_info

EXTRA_HINT = "pip install 'lightning-bridge[transformers]'"

try:
    import transformers
    from transformers import trainer_utils
except ImportError as missing:  # pragma: no cover - the core install has no transformers
    raise ImportError(
        f"determined.transformers needs Hugging Face transformers: {EXTRA_HINT}",
        name="transformers",
    ) from missing

__all__ = ["DetCallback", "get_ds_config_path_from_args", "get_metric_type"]

logger = logging.getLogger("det.transformers")

EVAL = "eval_"
TEST = "test_"
TRAIN = "train_"

# The Trainer's speed metrics (`train_runtime`, `eval_samples_per_second`, ...), not reported.
_SPEED_SUFFIXES = ("_runtime", "_per_second", "_compilation_time")
# Time metrics every report carries, so that a search measures trials in them.
_COUNTERS = ("batches", "epochs")


def get_metric_type(logs: dict[str, Any]) -> str:
    """`eval_` when any name starts with it, else `test_` when any does, else `train_`: which
    of the Trainer's logs are validations (Determined's rule)."""
    if any(k.startswith(EVAL) for k in logs):
        return EVAL
    if any(k.startswith(TEST) for k in logs):
        return TEST
    return TRAIN


def get_ds_config_path_from_args(args: Sequence[str]) -> str | None:
    """The DeepSpeed config path following `--deepspeed` in a command line, or None."""
    for i, arg in enumerate(args):
        if arg == "--deepspeed":
            if i + 1 >= len(args):
                raise ValueError("--deepspeed is the last argument: give the DeepSpeed config path")
            return args[i + 1]
    return None


def _prepare_deepspeed(argv: Sequence[str]) -> None:
    """A script given `--deepspeed CONFIG` trains on DeepSpeed's engine through the Trainer,
    which starts DeepSpeed's process group when it parses its arguments: on the CPU
    accelerator, prepare DeepSpeed first as DeepSpeedTrial's runner does (no kernel compiled
    at run time, all-gathers complete in order). The script imports this module before that."""
    if get_ds_config_path_from_args(argv) is None or importlib.util.find_spec("deepspeed") is None:
        return
    import deepspeed

    from lightning_bridge.translation.deepspeed._cpu import prepare_cpu_accelerator

    prepare_cpu_accelerator(deepspeed)


_prepare_deepspeed(sys.argv)


class DetCallback(transformers.TrainerCallback):
    """Reports a `transformers.Trainer`'s metrics, uploads its checkpoints and stops it on
    preemption, through a `det.core.init()` context; continues from the trial's latest
    checkpoint. `filter_metrics` keeps the metrics whose names contain one of its strings (the
    searcher's metric always kept); `user_data` is written to `my_data.json` in every
    checkpoint folder."""

    def __init__(
        self,
        core_context: Context,
        args: transformers.TrainingArguments,
        filter_metrics: list[str] | None = None,
        user_data: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.core_context = core_context
        self.filter_metrics = filter_metrics
        self.user_data = user_data
        self.last_train_metrics = -1
        self.last_eval_metrics = -1
        self.last_save = -1
        self.last_progress = 0
        self.required_metrics: list[str] = []
        info = get_cluster_info()
        if info is None:
            raise RuntimeError(
                "det.transformers.DetCallback needs a trial: run the script with "
                "`lightning-bridge run CONFIG.yaml` (its entrypoint `python3 SCRIPT`)"
            )
        self.info: ClusterInfo = info
        self.load_last_checkpoint(args)
        self.searcher_metric: str | None = None
        self.time_metric: str | None = None
        if self.info.task_type == "TRIAL":
            searcher = self.info.trial._config["searcher"]
            self._check_searcher_config(searcher, args)
            self.searcher_metric = searcher["metric"]
            self.time_metric = searcher.get("time_metric")
            if self.filter_metrics:
                self.filter_metrics.append(searcher["metric"])
                if self.time_metric:
                    self.filter_metrics.append(self.time_metric)
        # A final evaluation and save when training ends other than by preemption.
        self._force_final_save = True
        self._force_final_evaluate = True

    def load_last_checkpoint(self, args: transformers.TrainingArguments) -> None:
        """Download the trial's latest checkpoint (every file: each process needs every shard
        of a DeepSpeed state) into `output_dir`, and resume the Trainer from its last
        `checkpoint-N` folder; nothing when there is none or `overwrite_output_dir` is set."""
        latest = self.info.latest_checkpoint
        if latest is None:
            return
        if getattr(args, "overwrite_output_dir", False) is True:
            logger.info("overwrite_output_dir=True: the latest checkpoint is not downloaded.")
            return
        self.core_context.checkpoint.download(latest, args.output_dir)
        path = trainer_utils.get_last_checkpoint(args.output_dir)
        args.resume_from_checkpoint = path
        logger.info(f"Latest checkpoint downloaded to {path}.")

    def _check_searcher_config(
        self, config: dict[str, Any], args: transformers.TrainingArguments
    ) -> None:
        """The searcher's length must be the Trainer's (`--max_steps` in batches, else
        `--num_train_epochs` in epochs): a mismatch fails before training."""
        if args.max_steps > -1:
            unit, length, flag = "batches", args.max_steps, "--max_steps"
        else:
            unit, length, flag = "epochs", args.num_train_epochs, "--num_train_epochs"
        max_length = config.get("max_length")
        if isinstance(max_length, int):
            raise ValueError(
                "searcher.max_length without a unit is not read by the Hugging Face Trainer: "
                f"remove it and let {flag} say how long a trial trains."
            )
        if isinstance(max_length, dict):
            search_unit, search_length = next(iter(max_length.items()))
            if (search_unit, search_length) != (unit, length):
                raise ValueError(
                    f"The Trainer trains {unit}={length} ({flag}) but searcher.max_length is "
                    f"{search_unit}={search_length}: remove searcher.max_length (deprecated) "
                    f"or make the two agree."
                )
        elif config.get("name") in ("adaptive_asha", "async_halving"):
            time_metric, max_time = config["time_metric"], config["max_time"]
            self.required_metrics.append(time_metric)
            if time_metric not in _COUNTERS:
                return
            if (time_metric, max_time) != (unit, length):
                raise ValueError(
                    f"The Trainer trains {unit}={length} ({flag}) but the {config['name']} "
                    f"searcher's max_time is {time_metric}={max_time}: change "
                    f"searcher.max_time or {flag} so that they agree."
                )

    def _check_eval_metrics(self, metrics: dict[str, Any]) -> None:
        """A validation must hold the searcher's metric and its time metric."""
        missing = [
            f"{what} '{name}' (searcher.{field})"
            for what, name, field in (
                ("searcher metric", self.searcher_metric, "metric"),
                ("time metric", self.time_metric, "time_metric"),
            )
            if name is not None and name not in metrics
        ]
        if missing:
            raise ValueError(
                f"The Trainer's evaluation does not report the {' and the '.join(missing)}: "
                f"it reported {sorted(metrics)}; the search ranks trials and keeps the best "
                "checkpoints by them."
            )

    def _get_metrics(self, logs: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The logs to report (filtered, without the rounded `epoch` and the speed metrics)
        and their type."""
        metric_type = get_metric_type(logs)
        if self.filter_metrics:
            metrics = {k: v for k, v in logs.items() if any(m in k for m in self.filter_metrics)}
        else:
            metrics = dict(logs)
        metrics.pop("epoch", None)
        return {k: v for k, v in metrics.items() if not k.endswith(_SPEED_SUFFIXES)}, metric_type

    def on_log(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Report the logs as training or validation metrics (once per step each), and stop
        training when the trial is asked to (the Trainer saves at its end)."""
        if logs is None:
            logger.warning("on_log called without logs")
            return
        metrics, metric_type = self._get_metrics(logs)
        metrics.setdefault("batches", state.global_step)
        metrics.setdefault("epochs", state.epoch)
        if metric_type == TRAIN:
            # The Trainer's closing average comes at the step of the last in-training log.
            if self.last_train_metrics != state.global_step:
                self.last_train_metrics = state.global_step
                if state.is_world_process_zero:
                    self.core_context.train.report_metrics(
                        group="training", steps_completed=state.global_step, metrics=metrics
                    )
        elif metric_type == EVAL:
            # An evaluation after training may repeat the last one's step.
            if self.last_eval_metrics != state.global_step:
                self.last_eval_metrics = state.global_step
                if state.is_world_process_zero:
                    self._check_eval_metrics(metrics)
                    self.core_context.train.report_metrics(
                        group="validation", steps_completed=state.global_step, metrics=metrics
                    )
        else:
            logger.warning(f"Metrics not reported: metric type = {metric_type}.")
        if self.core_context.preempt.should_preempt():
            # The save at the end of training (on_epoch_end) checkpoints it once.
            control.should_training_stop = True

    def on_save(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Upload the checkpoint folder the Trainer just wrote (and `runs/`): every process its
        files, merged into one checkpoint."""
        self.last_save = state.global_step
        folder = f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and self.user_data is not None:
            with open(os.path.join(args.output_dir, folder, "my_data.json"), "w") as f:
                json.dump(self.user_data, f)
        metadata: dict[str, Any] = {"steps_completed": state.global_step}
        if self.info.task_type == "TRIAL":
            metadata["trial_id"] = self.info.trial.trial_id

        def selector(path: str) -> bool:
            return path.startswith((f"{folder}/", "runs/"))

        self.core_context.checkpoint.upload(
            args.output_dir, metadata=metadata, shard=True, selector=selector
        )

    def on_step_end(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Report progress in whole percents of `max_steps`."""
        if state.is_world_process_zero and args.max_steps > -1:
            progress = state.global_step / args.max_steps
            if int(progress * 100) > self.last_progress:
                self.last_progress = int(progress * 100)
                self.core_context.train.report_progress(progress)

    def on_epoch_end(
        self,
        args: transformers.TrainingArguments,
        state: transformers.TrainerState,
        control: transformers.TrainerControl,
        **kwargs: Any,
    ) -> None:
        """At the end of training, ask for the evaluation (unless preempted) and the save the
        Trainer has not made at this step; report progress in epochs."""
        if control.should_training_stop:
            ending = True
        elif args.max_steps > -1:
            ending = state.global_step >= args.max_steps
        else:
            ending = (state.epoch or 0) >= args.num_train_epochs
        if ending:
            preempted = self.core_context.preempt.should_preempt()
            if state.global_step > self.last_eval_metrics and self._force_final_evaluate:
                if not preempted:
                    control.should_evaluate = True
            if state.global_step > self.last_save and (self._force_final_save or preempted):
                control.should_save = True
        if state.is_world_process_zero and args.max_steps == -1:
            self.core_context.train.report_progress((state.epoch or 0) / args.num_train_epochs)
