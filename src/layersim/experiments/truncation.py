"""Discarding and skipping layers of fine-tuned encoders (Phang et al. §4 and §4.1).

- Untuned: exit the fine-tuned encoder after layer k and feed layer k into its own fine-tuned head
  (one forward pass gives every exit: the head copied out of the model, applied to each layer's CLS).
- Tuned: the same layer-k CLS representation of the fine-tuned encoder; the fine-tuned head trained
  further on it (or a fresh head, ``truncate.head: fresh``).
- TunedOrig: the pretrained encoder's layer-k CLS representation; the head fine-tuning starts from
  trained on it (or a fresh head).
- Skip: run the fine-tuned model with a contiguous span of layers [i, j] left out, and set the measured scores
  against the spans that layer similarity predicts droppable (layersim.similarity.pruning: ShortGPT's Block
  Influence, Gromov et al.'s angular distance).
Scores are the task's primary metric on validation examples.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping

import numpy as np
import torch
from tqdm.auto import tqdm

from layersim.data.batching import EncodedTask, encode_task, in_table_order, length_sorted_batches
from layersim.compute.device import autocast, to_device
from layersim.models.encoders import all_spans, continue_from, exit_at, num_layers, skip_span
from layersim.training.evaluate import compute_metrics, predict
from layersim.training.heads import HeadParams, Rows, majority_baseline, train_head
from layersim.data.io import ActivationTable
from layersim.models.registry import load_finetuned, load_task_model, load_tokenizer
from layersim.similarity.pruning import (PruningMeasures, length_only_baseline, mean_measures,
                                         position_only_baseline, predicted_spans, prediction_rank_correlation,
                                         random_layer_baseline, span_droppability)
from layersim.similarity.inference.seeds import seed_metrics
from layersim.models.task_heads import has_own_head, own_head
from layersim.data.tasks import TaskSpec

VARIANTS = ("untuned", "tuned", "tuned_orig")


def primary_score(spec: TaskSpec, logits: np.ndarray, labels: np.ndarray) -> float:
    return compute_metrics(spec, logits, labels)[spec.primary_metric]


def load_for_validation(folder, spec: TaskSpec, table, max_length: int, device: torch.device):
    """A fine-tuned checkpoint on `device`, its tokenizer, and `table` encoded for it."""
    tokenizer = load_tokenizer(folder)
    model = load_finetuned(folder, spec).to(device)
    return model, tokenizer, encode_task(table, spec, tokenizer, max_length)


def full_score(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
               device: torch.device, precision: str = "fp32") -> float:
    return primary_score(spec, predict(model, encoded, tokenizer, batch_size, device, precision=precision),
                         encoded.labels)


@torch.inference_mode()
def exit_logits(model, encoded: EncodedTask, tokenizer, batch_size: int, device: torch.device,
                precision: str = "fp32") -> list[np.ndarray]:
    """The logits of the fine-tuned model exiting after each layer k = 0 (embeddings) … L, from one
    forward pass: its own head (layersim.models.task_heads) on each layer's first-token state, which equals
    ``exit_at(model, k)`` exactly (nothing runs between the last layer and the head); for a family whose head
    cannot be copied (layersim.models.task_heads.COPYABLE_HEADS), ``exit_at(model, k)`` itself, once per k. The last
    entry is the full model's logits."""
    model.eval()
    per_layer: list[list] = [[] for _ in range(num_layers(model) + 1)]
    head = own_head(model).to(device).eval() if has_own_head(model) else None
    for indices, batch in length_sorted_batches(encoded, batch_size, tokenizer, with_labels=False):
        batch = to_device(batch, device)
        with autocast(device, precision):
            if head is None:  # a head that reads other tokens (decoders: the last) or cannot be copied
                for k, parts in enumerate(per_layer):
                    with exit_at(model, k):
                        parts.append((indices, model(**batch).logits.float().cpu().numpy()))
                continue
            out = model(**batch, output_hidden_states=True)
            for k, state in enumerate(out.hidden_states):
                logits = head(state[:, 0]).view(out.logits.shape)
                per_layer[k].append((indices, logits.float().cpu().numpy()))
    return [in_table_order(parts, len(encoded)) for parts in per_layer]


def untuned_scores(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int,
                   device: torch.device, precision: str = "fp32") -> list[float]:
    """Score of the fine-tuned model exiting after each layer k = 0 (embeddings) … L (the last: the full
    model)."""
    return [primary_score(spec, logits, encoded.labels)
            for logits in exit_logits(model, encoded, tokenizer, batch_size, device, precision)]


def initial_head(pretrained_folder, spec: TaskSpec, seed: int) -> torch.nn.Module:
    """The head that fine-tuning with `seed` starts from (the pretrained pooler where the architecture has
    one, a seeded random classifier): what TunedOrig trains on the pretrained model's layer k."""
    torch.manual_seed(seed)
    return own_head(load_task_model(pretrained_folder, spec))


def head_scores(spec: TaskSpec, train: ActivationTable, validation: ActivationTable, params: HeadParams,
                seed: int, start: torch.nn.Module | None = None, layers: Iterable[int] | None = None) -> list[float]:
    """Score of a head trained on each layer of `train` (or on each of `layers`) and evaluated on `validation`: a
    copy of `start` (a task model's own head) or, without one, a fresh head. Train rows are streamed from the table."""
    train_labels = _example_labels(train)
    validation_labels = _example_labels(validation)
    num_choices = spec.num_choices if spec.format == "multiple_choice" else 1
    what = "a fresh head" if start is None else "the task model's head"
    scores = []
    for k in tqdm(range(train.num_layers + 1) if layers is None else layers, desc="heads", leave=False):
        rows = Rows(num_choices, table=train, layer=k, chunk_rows=params.chunk_rows)
        head = train_head(spec, rows, train_labels, params, seed, head=copy.deepcopy(start), what=what)
        scores.append(primary_score(spec, head.logits(validation.layer(k)), validation_labels))
    return scores


def _example_labels(table: ActivationTable) -> np.ndarray:
    """One label per example (multiple-choice tables hold one row per choice)."""
    return table.labels()[table.choice == 0]


@torch.inference_mode()
def span_logits(model, encoded: EncodedTask, tokenizer, batch_size: int, device: torch.device,
                precision: str = "fp32") -> tuple[np.ndarray, dict[tuple[int, int], np.ndarray]]:
    """The full model's logits, and the logits with each contiguous span [i, j] (1 ≤ i ≤ j ≤ L) of layers
    skipped, equal to running ``skip_span(model, i, j)``: one full forward pass per batch gives the state
    after every layer i−1, from which only layers j+1..L run (:func:`layersim.models.encoders.continue_from`);
    spans that end at L need no layer at all, only the head on that state."""
    model.eval()
    num = num_layers(model)
    head = own_head(model).to(device).eval() if has_own_head(model) else None
    full: list = []
    spans: dict[tuple[int, int], list] = {span: [] for span in all_spans(num)}
    batches = length_sorted_batches(encoded, batch_size, tokenizer, with_labels=False)
    for indices, batch in tqdm(batches, total=-(-len(encoded) // batch_size), desc="skipped spans", leave=False):
        batch = to_device(batch, device)
        with autocast(device, precision):
            out = model(**batch, output_hidden_states=True)
            full.append((indices, out.logits.float().cpu().numpy()))
            for (i, j), parts in spans.items():
                before = out.hidden_states[i - 1]
                if j == num and head is None:  # no layer left to continue from, and no head to copy
                    with skip_span(model, i, j):
                        logits = model(**batch).logits
                elif j == num:
                    logits = head(before[:, 0]).view(out.logits.shape)
                else:
                    with continue_from(model, j, before):
                        logits = model(**batch).logits
                parts.append((indices, logits.float().cpu().numpy()))
    return in_table_order(full, len(encoded)), {span: in_table_order(parts, len(encoded))
                                                 for span, parts in spans.items()}


def span_scores(model, spec: TaskSpec, encoded: EncodedTask, tokenizer, batch_size: int, device: torch.device,
                precision: str = "fp32") -> tuple[float, dict[tuple[int, int], float]]:
    """The full model's score, and the score with every contiguous span [i, j] of layers skipped."""
    full, spans = span_logits(model, encoded, tokenizer, batch_size, device, precision)
    return (primary_score(spec, full, encoded.labels),
            {span: primary_score(spec, logits, encoded.labels) for span, logits in spans.items()})


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


PREDICTORS = ("angular_distance", "block_influence")  # Gromov et al. 2024; ShortGPT (Men et al. 2024)


def skip_predictions(measures: list[PruningMeasures], per_seed: list[dict[tuple[int, int], float]],
                     rows: Mapping[str, str]) -> tuple[dict, list[dict], dict]:
    """How well similarity predicts the measured skip scores, from each seed's measures and span scores.

    Returns the ``prediction`` part of the skip metrics — ``rows``: what each measure averages over; per
    predictor, between the seed-mean score of every
    span and its seed-mean predicted droppability: ``within_length``, the headline (the mean of the per-length
    Spearman rho, weighted by spans − 1: does the rule pick the right n layers among spans of n?),
    ``beyond_position`` (the same, partial on the span's first layer: what the rule knows beyond depth),
    ``all_spans`` (rho over all spans, mostly span length) and ``by_length``; ``baselines``: ``length_only``
    (the all-spans rho of span length alone), ``position_only`` (the within-length rho of the span's depth alone)
    and ``random_layer`` (random per-layer scores summed over the span,
    :data:`~layersim.similarity.pruning.RANDOM_LAYER_DRAWS` seeded draws: the within-length and beyond-position
    means and 95 % ranges chance gives, and the all-spans mean); and per n the span each rule picks (on the seed-mean measures) with
    its measured score beside the best span's — then per seed and span the predicted values (angular distance,
    summed Block Influence) for the plot rows, and per predictor and span the seed-mean value the correlation
    uses (for the figure). No p-value: spans share layers, so they are not independent."""
    mean = mean_measures(measures)
    scores = {span: float(np.mean([seed[span] for seed in per_seed])) for span in per_seed[0]}
    droppable = span_droppability(mean)
    prediction: dict = {"rows": dict(rows)}
    for name in PREDICTORS:
        rank = prediction_rank_correlation(scores, droppable[name])
        prediction[name] = {"within_length": _rounded(rank["within_length"]),
                            "beyond_position": _rounded(rank["beyond_position"]),
                            "all_spans": _rounded(rank["all"]["spearman"]), "spans": rank["all"]["spans"],
                            "by_length": {f"length_{n}": _finite(r) for n, r in rank["by_length"].items()}}
    prediction["baselines"] = {"length_only": {"all_spans": _rounded(length_only_baseline(scores))},
                               "position_only": {"within_length": _rounded(position_only_baseline(scores))},
                               "random_layer": {key: _rounded(value)
                                                for key, value in random_layer_baseline(scores).items()}}
    picked = {}
    for row in predicted_spans(mean):
        n = row["length"]
        best = max((s for s in scores if s[1] - s[0] + 1 == n), key=lambda s: (scores[s], -s[0]))
        picked[f"length_{n}"] = {"best": _span_entry(best, scores),
                                 "angular_distance": _span_entry(row["angular_distance"], scores),
                                 "block_influence": _span_entry(row["block_influence_span"], scores),
                                 "block_influence_layers": ",".join(map(str, row["block_influence_layers"] or ()))}
    prediction["picked"] = picked
    values = [{span: {name: _rounded(-seed[name][span]) for name in PREDICTORS} for span in scores}
              for seed in [*map(span_droppability, measures), droppable]]
    return prediction, values[:-1], {name: {span: row[name] for span, row in values[-1].items()} for name in PREDICTORS}


def _span_entry(span: tuple[int, int] | None, scores: dict[tuple[int, int], float]) -> dict | None:
    return None if span is None else {"span": f"{span[0]}-{span[1]}", "score": round(scores[span], 6)}


def _finite(rank: dict) -> dict:
    return {key: _rounded(value) if key != "spans" else value for key, value in rank.items()}


def mean_over_seeds(per_seed: Iterable[list[float]]) -> list[float]:
    return np.mean(np.asarray(list(per_seed), dtype=float), axis=0).tolist()


def truncation_summary(per_seed: dict[str, list], full: list[float], baseline: float, seeds, tolerance: float,
                       metric: str, flagged: Collection[int] = ()) -> tuple[dict, list[dict]]:
    """The truncate stage's metrics (seed means per variant and exit layer, the full model, the majority
    baseline, how many top layers the untuned and tuned models can drop within `tolerance`; under
    ``over_seeds`` also the mean without the `flagged` seeds' runs) and its plot rows (one per variant, seed
    and exit layer, with whether the seed's run converged)."""
    unconverged = {f"seed{s}" for s in flagged}
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
        # Seeds as the unit: each seed's curve is one observation (mean ± sd, a t-interval with >= 3 seeds).
        "over_seeds": {"full": seed_metrics({f"seed{s}": np.array([v]) for s, v in zip(seeds, full)},
                                            lambda values: _rounded(values[0]), flagged=unconverged),
                       **{variant: seed_metrics({f"seed{s}": np.asarray(run) for s, run in zip(seeds, runs)},
                                                _per_layer, flagged=unconverged)
                          for variant, runs in per_seed.items()}},
    }
    rows = [{"series": f"{variant} seed {seed}", "variant": variant, "seed": seed, "layer": k,
             "score": round(float(v), 6), "converged": seed not in flagged}
            for variant, runs in per_seed.items() for seed, run in zip(seeds, runs) for k, v in enumerate(run)]
    return metrics, rows


def _rounded(value) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


def _per_layer(values) -> dict[str, float | None]:
    return {f"layer_{k:02d}": _rounded(v) for k, v in enumerate(values)}


def majority_score(spec: TaskSpec, train: ActivationTable, validation: ActivationTable) -> float:
    """The validation score of always predicting the train split's majority class (the mean for regression,
    the most frequent answer position for multiple choice): Phang's red dotted line. Labels come from the
    tables' first choice row of each example."""
    validation_labels = validation.labels()[validation.choice == 0]
    logits = majority_baseline(spec, train.labels()[train.choice == 0], validation_labels)
    return primary_score(spec, logits, validation_labels)
