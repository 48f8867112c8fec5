"""ReSi's training-intervention test (Klabunde et al. 2025), label randomization, on one task: the model fine-tuned
with the labels of a share of the train examples shuffled among them, at each level of that share and with each seed;
a measure that tracks what training did should find two runs of one level more alike than two runs of different
levels. Per layer k (the model's own head token on the clean validation examples), the AUPRC of the same-level pairs
against the different-level pairs (layersim.similarity.grounding.grouping_auprc), and the measures ranked over the
layers with a paired bootstrap.

Not a pipeline stage: `python tools/grounding_interventions.py` runs it (docs/outputs.md, "Which measure to trust"),
from the pipeline's downloaded model and task. ReSi's other two interventions (a shortcut feature, augmentation) are
not built."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity.grounding import Ranking, grouping_per_layer, rank_measures, separation_chance

TEST = "label_noise"


def shuffled_labels(labels: np.ndarray, share: float, seed: int) -> np.ndarray:
    """`labels` with those of a random `share` of the examples permuted among them (the label distribution kept,
    which fits classes and regression targets alike); share 0: unchanged, 1: every label shuffled."""
    if not 0 <= share <= 1:
        raise LayersimError(f"a label-noise level is a share of the train examples from 0 to 1, got {share!r}.")
    rng = np.random.default_rng(seed)
    labels = np.array(labels, copy=True)
    chosen = rng.choice(len(labels), size=round(share * len(labels)), replace=False)
    labels[chosen] = labels[rng.permutation(chosen)]
    return labels


def run_label(level: float, seed: int) -> str:
    return f"noise{level:g}[{seed}]"


@dataclass
class InterventionOutputs:
    full: dict
    rows: list[dict]
    ranking: Ranking


def label_noise_runs(pretrained: Path, task_dir: Path, task: str, params, levels: Sequence[float],
                     log=lambda *args: None) -> dict[str, list[np.ndarray]]:
    """Each (level, seed) run's layers on the validation examples (the model's own head token), by run label; the
    noisy labels drawn with the seed, so that a level's runs differ in their noise as in their initialisation."""
    from layersim.compute.device import resolve_device
    from layersim.experiments.extract import pooled_layers
    from layersim.models.registry import load_tokenizer
    from layersim.params.model_kind import own_head_pooling
    from layersim.data.tasks import get_task
    from layersim.training.train import encoded_splits, finetune

    spec, device = get_task(task), resolve_device(params.device)
    tokenizer = load_tokenizer(pretrained)
    train, validation = encoded_splits(task_dir, spec, tokenizer, params.finetune.max_length)
    pooling = own_head_pooling(params.model)
    runs = {}
    for level in levels:
        for seed in params.seeds:
            noisy = dataclasses.replace(train, labels=shuffled_labels(train.labels, level, seed))
            log("fine-tuning %s with %g of the train labels shuffled, seed %d", task, level, seed)
            model, _ = finetune(pretrained, spec, noisy, validation, params.finetune, seed, device=device)
            pooled = pooled_layers(model.base_model, tokenizer, validation, [pooling], params.extract.batch_size, device)
            runs[run_label(level, seed)] = [np.asarray(layer, dtype=np.float64) for layer in pooled.layers[pooling]]
    return runs


def rank_on_groups(runs: dict[str, list[np.ndarray]], groups: dict[str, object], measures: Sequence[str],
                   options: dict[str, dict], resamples: int, seed: int) -> InterventionOutputs:
    """Every measure's per-layer grouping AUPRC over the runs (label → layers; `groups`: label → its level), ranked."""
    from layersim.similarity.comparisons import number, stacked_matrix

    num_layers = len(next(iter(runs.values())))
    starts = dict(zip(runs, range(0, num_layers * len(runs), num_layers)))
    per_layer, full = {}, {}
    for measure in measures:
        matrix = stacked_matrix(measure, runs, **options.get(measure, {}))
        scores, same, different = grouping_per_layer(matrix, starts, num_layers, groups)
        per_layer[measure] = scores
        full[measure] = {TEST: {"per_layer": [number(v) for v in scores], "same_pairs": same,
                                "different_pairs": different, "chance": number(separation_chance(same, different))}}
    ranking = rank_measures({TEST: per_layer}, resamples, seed)
    rows = []
    for place, measure in enumerate(sorted(measures, key=lambda m: ranking.mean_rank[m]), 1):
        low, high = ranking.interval[TEST][measure]
        full[measure][TEST] |= {"score": number(ranking.score[TEST][measure]), "low": number(low), "high": number(high)}
        rows.append({"measure": measure, "place": place, TEST: number(ranking.score[TEST][measure]),
                     f"{TEST}_low": number(low), f"{TEST}_high": number(high),
                     f"{TEST}_chance": full[measure][TEST]["chance"],
                     "rank_top_share": number(ranking.top_share[measure])})
    return InterventionOutputs(full, rows, ranking)
