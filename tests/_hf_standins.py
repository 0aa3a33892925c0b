"""Local stand-ins for what Determined's `hf_trainer_api/hf_language_modeling` example downloads
from the Hugging Face Hub, written beside the example so that it runs unchanged and offline:

- `gpt2/`: a 2-layer GPT-2 with random weights and a byte-level BPE tokenizer trained here on
  the stand-in text (`--model_name_or_path gpt2` finds the folder before the Hub);
- `wikitext/`: a dataset folder whose README's `configs` name `wikitext-2-raw-v1`, with
  `train` and `validation` text files (`load_dataset("wikitext", "wikitext-2-raw-v1")` reads
  a local folder of that name before the Hub);
- `accuracy/accuracy.py`: an `evaluate` metric computing accuracy (`evaluate.load("accuracy")`
  loads `./accuracy/accuracy.py` before the Hub).

The text is sentences drawn from a small grammar with a seed: a pattern the model learns in
a hundred steps. The tokenizer's `model_max_length` (32) is the example's block size."""

from __future__ import annotations

import pathlib
import random

# The dataset configuration the example names, and the stand-in model's block size.
DATASET_CONFIG = "wikitext-2-raw-v1"
BLOCK = 32

ACCURACY = '''"""Accuracy: the share of predictions equal to their references (a local
stand-in for the Hub's `evaluate-metric/accuracy`)."""

import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="The share of predictions equal to their references.",
            citation="",
            inputs_description="predictions and references: integer class ids",
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        same = sum(int(p == r) for p, r in zip(predictions, references))
        return {"accuracy": same / len(references) if len(references) else 0.0}
'''

DATASET_README = f"""---
configs:
- config_name: {DATASET_CONFIG}
  data_files:
  - split: train
    path: {DATASET_CONFIG}/train.txt
  - split: validation
    path: {DATASET_CONFIG}/validation.txt
---
Sentences from a small grammar: a stand-in for wikitext in the tests.
"""

SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child"]
VERBS = ["sees", "likes", "follows", "finds", "helps", "calls"]
OBJECTS = ["the ball", "a tree", "the house", "the river", "a book", "the garden"]


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for _ in range(n)]


def offline_env(root: pathlib.Path) -> dict[str, str]:
    """Hugging Face's libraries offline, their caches under `root`."""
    return {
        "HF_HOME": str(root / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def write_standins(folder: pathlib.Path) -> None:
    """`gpt2/`, `wikitext/` and `accuracy/` in `folder` (see the module docstring)."""
    import tokenizers
    import transformers

    train, validation = sentences(600, 0), sentences(60, 1)
    data = folder / "wikitext" / DATASET_CONFIG
    data.mkdir(parents=True)
    (folder / "wikitext" / "README.md").write_text(DATASET_README)
    (data / "train.txt").write_text("\n".join(train) + "\n")
    (data / "validation.txt").write_text("\n".join(validation) + "\n")

    metric = folder / "accuracy"
    metric.mkdir()
    (metric / "accuracy.py").write_text(ACCURACY)

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        train, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=BLOCK,
    )
    model_dir = folder / "gpt2"
    tokenizer.save_pretrained(model_dir)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=BLOCK,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    transformers.set_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(model_dir)
