"""A Hugging Face `transformers.Trainer` script with Determined's `DetCallback`.

A small GPT-2 (2 layers, built from a config: nothing is downloaded) learns to continue
sequences of token ids that count up modulo the vocabulary size. The Trainer's arguments come
from the command line (the config's entrypoint), its learning rate from the trial's
hyperparameters. `DetCallback` reports the Trainer's logs as training and validation metrics,
uploads each checkpoint folder the Trainer saves, stops training on `experiment pause` or a
search's decision, and continues a paused trial from its latest checkpoint.
"""

import logging
import sys

import determined as det
import torch
import transformers
from determined.transformers import DetCallback

VOCAB = 64
LENGTH = 16


class Counting(torch.utils.data.Dataset):
    """Pre-tokenized sequences `start, start+1, ...` (mod VOCAB) from a seed."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (start + torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "run it with `lightning-bridge run const.yaml`"
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(sys.argv[1:])
    args.learning_rate = info.trial.hparams["learning_rate"]
    distributed = None
    if args.world_size > 1:
        distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        callback = DetCallback(core_context, args, user_data={"task": "counting"})
        transformers.set_seed(args.seed)
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2
        )
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config),
            args=args,
            train_dataset=Counting(512, 0),
            eval_dataset=Counting(64, 1),
            callbacks=[callback],
        )
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)


if __name__ == "__main__":
    main()
