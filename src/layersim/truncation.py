"""Discarding and skipping layers of fine-tuned encoders (Phang et al. §4 and §4.1).

- Untuned: exit the fine-tuned encoder after layer k and feed layer k into its own fine-tuned head.
- Tuned: the same layer-k CLS representation of the fine-tuned encoder, with a fresh head.
- TunedOrig: the pretrained encoder's layer-k CLS representation, with a fresh head.
- Skip: run the fine-tuned model with a contiguous span of layers [i, j] left out.
Scores are the task's primary metric on validation examples.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from tqdm.auto import tqdm

from layersim.batching import EncodedTask, encode_task
from layersim.encoders import all_spans, exit_at, num_layers, skip_span
from layersim.evaluate import compute_metrics, predict
from layersim.heads import HeadParams, train_head
from layersim.io import ActivationTable
from layersim.models import load_finetuned, load_tokenizer
from layersim.tasks import TaskSpec

VARIANTS = ("untuned", "tuned", "tuned_orig")


def primary_score(spec: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> float:
    return compute_metrics(spec, logits, labels)[spec.primary_metric]


def load_for_validation(folder, spec: TaskSpec, table, max_length: int, device: torch.device):
    """A fine-tuned checkpoint on `device`, its tokenizer, and `table` encoded for it."""
    tokenizer = load_tokenizer(folder)
    model = load_finetuned(folder, spec).to(device)
    return model, tokenizer, encode_task(table, spec, tokenizer, max_length)


def full_score(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
               device: torch.device) -> float:
    return primary_score(spec, predict(model, encoded, tokenizer, batch_size, device), encoded.labels)


def untuned_scores(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
                   device: torch.device) -> list[float]:
    """Score of the fine-tuned model exiting after each layer k = 0 (embeddings) … L."""
    scores = []
    for k in tqdm(range(num_layers(model) + 1), desc="untuned exits", leave=False):
        with exit_at(model, k):
            scores.append(primary_score(spec, predict(model, encoded, tokenizer, batch_size, device), encoded.labels))
    return scores


def head_scores(spec: TaskSpec, train: ActivationTable, validation: ActivationTable, params: HeadParams,
                seed: int) -> list[float]:
    """Score of a fresh head trained on each layer of `train` and evaluated on `validation`."""
    train_labels = _example_labels(train)
    validation_labels = _example_labels(validation)
    scores = []
    for k in tqdm(range(train.num_layers + 1), desc="fresh heads", leave=False):
        head = train_head(spec, train.layer(k), train_labels, params, seed)
        scores.append(primary_score(spec, head.logits(validation.layer(k)), validation_labels))
    return scores


def _example_labels(table: ActivationTable) -> np.ndarray:
    """One label per example (multiple-choice tables hold one row per choice)."""
    return table.labels()[table.choice == 0]


def span_scores(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
                device: torch.device) -> dict[tuple[int, int], float]:
    """Score with every contiguous span [i, j] (1 ≤ i ≤ j ≤ L) of layers skipped."""
    scores = {}
    for i, j in tqdm(all_spans(num_layers(model)), desc="skipped spans", leave=False):
        with skip_span(model, i, j):
            scores[(i, j)] = primary_score(spec, predict(model, encoded, tokenizer, batch_size, device),
                                           encoded.labels)
    return scores


def fewest_layers_within(scores: list[float], full: float, tolerance: float) -> int:
    """The smallest exit layer k whose score is within `tolerance` of the full model's."""
    return next(k for k, s in enumerate(scores) if s >= full - tolerance) if max(scores) >= full - tolerance \
        else len(scores) - 1


def span_summary(scores: dict[tuple[int, int], float], full: float, tolerance: float) -> dict:
    """The worst single-layer skip and the longest span whose loss stays within `tolerance`."""
    singles = {i: s for (i, j), s in scores.items() if i == j}
    worst = min(singles, key=singles.get)
    cheap = [(j - i + 1, s, (i, j)) for (i, j), s in scores.items() if s >= full - tolerance]
    largest = max(cheap) if cheap else None
    return {
        "worst_single_layer": {"layer": worst, "score": singles[worst]},
        "largest_span_within_tolerance": None if largest is None else
        {"first": largest[2][0], "last": largest[2][1], "length": largest[0], "score": largest[1]},
    }


def mean_over_seeds(per_seed: Iterable[list[float]]) -> list[float]:
    return np.mean(np.asarray(list(per_seed), dtype=float), axis=0).tolist()


def truncation_summary(per_seed: dict[str, list], full: list[float], baseline: float, seeds, tolerance: float,
                       metric: str) -> tuple[dict, list[dict]]:
    """The truncate stage's metrics (seed means per variant and exit layer, the full model, the majority
    baseline, how many top layers the untuned and tuned models can drop within `tolerance`) and its plot
    rows (one per variant, seed and exit layer)."""
    mean = {variant: np.mean(runs, axis=0) for variant, runs in per_seed.items()}
    fewest = fewest_layers_within(mean["untuned"].tolist(), float(np.mean(full)), tolerance)
    fewest_tuned = fewest_layers_within(mean["tuned"].tolist(), float(np.mean(full)), tolerance)
    num_layers = len(mean["untuned"]) - 1
    metrics = {
        "metric": metric,
        "full": round(float(np.mean(full)), 6),
        "majority_baseline": round(baseline, 6),
        "tolerance": tolerance,
        "fewest_layers_untuned_within_tolerance": fewest,
        "droppable_top_layers_untuned": num_layers - fewest,
        "droppable_top_layers_tuned": num_layers - fewest_tuned,
        **{variant: {f"layer_{k:02d}": round(float(v), 6) for k, v in enumerate(values)}
           for variant, values in mean.items()},
    }
    rows = [{"variant": variant, "seed": seed, "layer": k, "score": round(float(v), 6)}
            for variant, runs in per_seed.items() for seed, run in zip(seeds, runs) for k, v in enumerate(run)]
    return metrics, rows
