"""Turning a normalized task table into padded model inputs, shared by training, evaluation and
extraction. Inputs are tokenized once; each batch is padded only to its own longest sequence."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from layersim.data.tasks import TaskSpec
from layersim.data.words import encode_words, ptb_words, words_tokenizer


@dataclass
class EncodedTask:
    """Token ids of every (example, choice) sequence; `features[i]` is a list of `num_choices` dicts
    (one dict for single and pair tasks)."""

    features: list[list[dict[str, list[int]]]]
    labels: np.ndarray
    example_id: np.ndarray
    num_choices: int
    # With encode_task(words=True), per example and choice, the second encoding the "tokens" pooling and word
    # attention read (the PTB words, pre-split: layersim.data.words.encode_words): its token ids, its words
    # ((words, 3) [segment, word, last sub-word position]; a multiple-choice context's only in choice 0) and
    # each token's attention unit (word or special token).
    words: list[list[np.ndarray]] | None = None
    word_features: list[list[dict[str, list[int]]]] | None = None
    word_units: list[list[np.ndarray]] | None = None
    # Each example's cluster (the task table's cluster_id: examples sharing a premise, question or context);
    # None: every example its own.
    cluster_id: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.cluster_id is None:
            self.cluster_id = np.asarray(self.example_id, dtype=np.int64).copy()

    def clusters_of(self, example_id: np.ndarray) -> np.ndarray:
        """The cluster of each of `example_id` (examples of this task, e.g. the example of each word row)."""
        order = np.argsort(self.example_id, kind="stable")
        return self.cluster_id[order[np.searchsorted(self.example_id, example_id, sorter=order)]]

    def __len__(self) -> int:
        return len(self.features)

    def head(self, count: int) -> "EncodedTask":
        """The first `count` examples (all when there are fewer)."""
        words = [None if part is None else part[:count] for part in (self.words, self.word_features, self.word_units)]
        return EncodedTask(self.features[:count], self.labels[:count], self.example_id[:count], self.num_choices,
                           *words, cluster_id=self.cluster_id[:count])


def encode_task(table: pa.Table, spec: TaskSpec, tokenizer, max_length: int, words: bool = False) -> EncodedTask:
    """Tokenize every (example, choice); `words` also encodes the examples' PTB words pre-split (a fast
    tokenizer's word ids) for the "tokens" pooling and word attention (layersim.data.words)."""
    columns = table.to_pydict()
    tokenizer_words = words_tokenizer(tokenizer) if words else None  # refuses a slow tokenizer before any work
    if spec.format == "single":
        texts = [(t,) for t in columns["text"]]
        encoded = tokenizer(columns["text"], truncation=True, max_length=max_length)
        groups, num_choices = 1, 1
    elif spec.format == "pair":
        texts = list(zip(columns["text_a"], columns["text_b"]))
        encoded = tokenizer(columns["text_a"], columns["text_b"], truncation=True, max_length=max_length)
        groups, num_choices = 1, 1
    else:
        num_choices = spec.num_choices
        contexts = [c for c, choices in zip(columns["context"], columns["choices"]) for _ in choices]
        endings = [e for choices in columns["choices"] for e in choices]
        texts = list(zip(contexts, endings))
        # Long contexts are cut from the context side so that every choice survives intact.
        encoded = tokenizer(contexts, endings, truncation="only_first", max_length=max_length)
        groups = num_choices
    keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded]
    rows = [{k: encoded[k][i] for k in keys} for i in range(len(encoded["input_ids"]))]
    features = [rows[i:i + groups] for i in range(0, len(rows), groups)]
    labels = np.asarray(columns["label"], dtype=np.float64 if spec.regression else np.int64)
    located = word_features = units = None
    if words:
        segments = [[ptb_words(row[s]) for row in texts] for s in range(len(texts[0]) if texts else 0)]
        truncation = "only_first" if spec.format == "multiple_choice" else True
        word_rows, located, units = encode_words(tokenizer_words, segments, max_length, truncation) if texts else [[]] * 3
        if groups > 1:  # a multiple-choice context's words once: from the first choice's input
            located = [w if i % groups == 0 else w[w[:, 0] == 1] for i, w in enumerate(located)]
        located, word_features, units = ([part[i:i + groups] for i in range(0, len(part), groups)]
                                         for part in (located, word_rows, units))
    example_id = np.asarray(columns["example_id"], dtype=np.int64)
    clusters = columns.get("cluster_id")  # absent from a table built in memory: every example its own
    return EncodedTask(features, labels, example_id, num_choices, located, word_features, units,
                       None if clusters is None else np.asarray(clusters, dtype=np.int64))


_PAD_KEYS = {"input_ids", "token_type_ids", "attention_mask"}


def padded_width(longest: int, multiple: int | None, cap: int | None = None) -> int:
    """The width a batch whose longest row has `longest` tokens is padded to: `longest` itself without a
    `multiple`; else the next multiple of it (a few static shapes: layersim.compute.compiled), but never past
    `cap` (max_length: what the position embeddings hold) unless `longest` is."""
    if not multiple:
        return longest
    width = -(-longest // multiple) * multiple
    return max(longest, min(width, cap)) if cap else width


def pad_rows(rows: list[dict[str, list[int]]], tokenizer, multiple: int | None = None,
             cap: int | None = None) -> dict[str, torch.Tensor]:
    """Pad token-id rows to their longest (or to :func:`padded_width` with a `multiple`) into int64 tensors, as
    ``tokenizer.pad(rows, return_tensors="pt")`` does (the tokenizer's pad id, pad token type id and padding side;
    mask 0), but with NumPy: 5-10x faster, which matters when a small model's step takes milliseconds."""
    if tokenizer.pad_token_id is None or not rows or not set(rows[0]) <= _PAD_KEYS:
        # The tokenizer's own error for a tokenizer without a pad token, its own rules for other keys.
        longest = max(len(row["input_ids"]) for row in rows) if rows and multiple else None
        width = {"padding": "max_length", "max_length": padded_width(longest, multiple, cap)} if longest else {}
        return dict(tokenizer.pad(rows, return_tensors="pt", **width))
    lengths = np.fromiter((len(row["input_ids"]) for row in rows), dtype=np.int64, count=len(rows))
    width = padded_width(int(lengths.max()), multiple, cap)
    positions = np.arange(width)
    if tokenizer.padding_side == "left":
        filled = positions >= (width - lengths)[:, None]
    else:
        filled = positions < lengths[:, None]
    pad_values = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
    batch = {}
    for key in rows[0]:
        padded = np.full((len(rows), width), pad_values.get(key, 0), dtype=np.int64)
        # Boolean assignment fills row by row, left to right: the rows' tokens in order.
        padded[filled] = np.fromiter(itertools.chain.from_iterable(row[key] for row in rows), dtype=np.int64,
                                     count=int(lengths.sum()))
        batch[key] = torch.from_numpy(padded)
    return batch


def collate(encoded: EncodedTask, indices: Sequence[int], tokenizer, with_labels: bool = True, *,
            multiple: int | None = None, cap: int | None = None) -> dict[str, torch.Tensor]:
    """Pad the chosen examples into one batch (to their longest, or per :func:`padded_width`); multiple choice
    gives (batch, choices, length)."""
    indices = np.asarray(indices)
    batch = pad_rows([row for i in indices for row in encoded.features[i]], tokenizer, multiple, cap)
    if encoded.num_choices > 1:
        batch = {k: v.view(len(indices), encoded.num_choices, -1) for k, v in batch.items()}
    if with_labels:
        labels = encoded.labels[indices]
        # Regression heads compute in float32; the tables keep the exact float64 labels.
        batch["labels"] = torch.from_numpy(labels.astype(np.float32) if labels.dtype == np.float64 else labels)
    return batch


def collate_words(encoded: EncodedTask, indices: Sequence[int], tokenizer) -> dict[str, torch.Tensor]:
    """The chosen examples' word encodings (encode_task(words=True)) padded into one (rows, length) batch, one
    row per (example, choice)."""
    return pad_rows([row for i in indices for row in encoded.word_features[i]], tokenizer)


def sequential_batches(encoded: EncodedTask, batch_size: int, tokenizer, with_labels: bool = True
                       ) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """Batches in table order, with the indices of the examples they hold."""
    for start in range(0, len(encoded), batch_size):
        indices = np.arange(start, min(start + batch_size, len(encoded)))
        yield indices, collate(encoded, indices, tokenizer, with_labels)


def length_sorted_batches(encoded: EncodedTask, batch_size: int, tokenizer, with_labels: bool = True
                          ) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """Batches of examples of similar length, longest first, with the indices of the examples they hold:
    each batch is padded to its own longest, so sorting wastes little on padding (evaluation only; the
    caller puts outputs back in table order by the indices; the longest batch first shows peak memory
    at once)."""
    longest = np.fromiter((max(len(row["input_ids"]) for row in rows) for rows in encoded.features),
                          dtype=np.int64, count=len(encoded))
    order = np.argsort(-longest, kind="stable")
    for start in range(0, len(encoded), batch_size):
        indices = order[start:start + batch_size]
        yield indices, collate(encoded, indices, tokenizer, with_labels)


def in_table_order(parts: list[tuple[np.ndarray, np.ndarray]], num_examples: int) -> np.ndarray:
    """Per-batch outputs (indices, rows) put back into table order: row k of the result is example k's."""
    first = parts[0][1]
    out = np.empty((num_examples, *first.shape[1:]), dtype=first.dtype)
    for indices, rows in parts:
        out[indices] = rows
    return out
