"""A tiny real Hugging Face training job, for the integration tests: no stepwatch import, no download.

A one-layer BERT (hidden size 16, vocabulary 100) learns whether the first token is above 50, from
data made here. Used in-process (:func:`model`, :func:`data`, :func:`arguments`) and as a plain
script run as a subprocess: ``python hf_tiny.py OUTPUT_DIR [MAX_STEPS]``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``n`` sequences of 8 random tokens, labelled by whether the first one is above 50."""

    def __init__(self, n: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 100, (n, 8), generator=generator)
        self.y = (self.x[:, 0] > 50).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.y[i]}


def model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def arguments(output_dir: str, **overrides: Any) -> TrainingArguments:
    values: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    values.update(overrides)
    return TrainingArguments(**values)


def trainer(output_dir: str, callbacks: list[Any] | None = None, **overrides: Any) -> Trainer:
    return Trainer(
        model=model(),
        args=arguments(output_dir, **overrides),
        train_dataset=Data(64),
        eval_dataset=Data(16, seed=1),
        callbacks=callbacks,
    )


if __name__ == "__main__":
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    trainer(sys.argv[1], max_steps=steps, eval_strategy="steps", eval_steps=6).train()
