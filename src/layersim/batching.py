"""Turning a normalized task table into padded model inputs, shared by training, evaluation and
extraction. Inputs are tokenized once; each batch is padded only to its own longest sequence."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from layersim.tasks import TaskSpec


@dataclass
class EncodedTask:
    """Token ids of every (example, choice) sequence; `features[i]` is a list of `num_choices` dicts
    (one dict for single and pair tasks)."""

    features: list[list[dict[str, list[int]]]]
    labels: np.ndarray
    example_id: np.ndarray
    num_choices: int

    def __len__(self) -> int:
        return len(self.features)


def encode_task(table: pa.Table, spec: TaskSpec, tokenizer, max_length: int) -> EncodedTask:
    columns = table.to_pydict()
    if spec.format == "single":
        encoded = tokenizer(columns["text"], truncation=True, max_length=max_length)
        groups, num_choices = 1, 1
    elif spec.format == "pair":
        encoded = tokenizer(columns["text_a"], columns["text_b"], truncation=True, max_length=max_length)
        groups, num_choices = 1, 1
    else:
        num_choices = spec.num_choices
        contexts = [c for c, choices in zip(columns["context"], columns["choices"]) for _ in choices]
        endings = [e for choices in columns["choices"] for e in choices]
        # Long contexts are cut from the context side so that every choice survives intact.
        encoded = tokenizer(contexts, endings, truncation="only_first", max_length=max_length)
        groups = num_choices
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded]
    rows = [{k: encoded[k][i] for k in keys} for i in range(len(encoded["input_ids"]))]
    features = [rows[i:i + groups] for i in range(0, len(rows), groups)]
    labels = np.asarray(columns["label"], dtype=np.float64 if spec.regression else np.int64)
    return EncodedTask(features, labels, np.asarray(columns["example_id"], dtype=np.int64), num_choices)


def collate(encoded: EncodedTask, indices: Sequence[int], tokenizer, with_labels: bool = True) -> dict[str, torch.Tensor]:
    """Pad the chosen examples into one batch; multiple choice gives (batch, choices, length)."""
    flat = [row for i in indices for row in encoded.features[i]]
    batch = dict(tokenizer.pad(flat, return_tensors="pt"))
    if encoded.num_choices > 1:
        batch = {k: v.view(len(indices), encoded.num_choices, -1) for k, v in batch.items()}
    if with_labels:
        labels = encoded.labels[np.asarray(indices)]
        # Regression heads compute in float32; the tables keep the exact float64 labels.
        batch["labels"] = torch.from_numpy(labels.astype(np.float32) if labels.dtype == np.float64 else labels)
    return batch


def sequential_batches(encoded: EncodedTask, batch_size: int, tokenizer, with_labels: bool = True
                       ) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """Batches in table order, with the indices of the examples they hold."""
    for start in range(0, len(encoded), batch_size):
        indices = np.arange(start, min(start + batch_size, len(encoded)))
        yield indices, collate(encoded, indices, tokenizer, with_labels)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
