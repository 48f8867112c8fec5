"""ReSi's training-intervention tests (Klabunde et al. 2025) on one task: the model fine-tuned on a train table changed
by an intervention (layersim.data.interventions: label noise, a label-revealing shortcut token, text augmentation) at
each of its levels and with each seed. A measure that tracks what training did should order the runs as the
intervention does. Per layer k (the model's own head token), over every pair of runs, two tests:

- grouping (ReSi's AUPRC): two runs of one level more alike than two runs of different levels
  (layersim.similarity.grounding.grouping_per_layer);
- ordering (Spearman): the further apart two runs' levels, the less alike
  (layersim.similarity.grounding.ordering_per_layer).

Each intervention's runs are represented on the clean validation examples; the shortcut's also on the validation
examples that all carry the shortcut token, where a run that relies on it differs most (ReSi represents its shortcut
runs on data with the token). The measures are ranked over the layers of every test with a paired bootstrap. A
level-0 run is the same fine-tuning for every intervention (the unchanged train table), so it is trained once per
seed.

Not a pipeline stage: `python tools/grounding_interventions.py` runs it (docs/outputs.md, "Which measure to trust"),
from the pipeline's downloaded model and task."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layersim.data.interventions import shortcut_edges, with_augmentation, with_label_noise, with_shortcut
from layersim.errors import LayersimError
from layersim.similarity.grounding import (Ranking, grouping_auprc, ordering_spearman, rank_measures,
                                           separation_chance)

CLEAN, SHORTCUT_INPUTS = "clean", "shortcut"  # the validation inputs runs are represented on


@dataclass(frozen=True)
class Intervention:
    """One of ReSi's training interventions: how the train table changes at a level (`change(table, spec, level,
    seed, edges)`), its levels by default, the validation inputs its runs are represented on (the first: the main
    one), and what a level is (for the tests' labels)."""

    name: str
    change: Callable
    levels: tuple[float, ...]
    inputs: tuple[str, ...]
    level_is: str


INTERVENTIONS = {
    "label_noise": Intervention("label_noise", lambda table, spec, level, seed, edges:
                                with_label_noise(table, spec, level, seed), (0.0, 0.5, 1.0), (CLEAN,),
                                "share of train labels shuffled"),
    "shortcut": Intervention("shortcut", with_shortcut, (0.0, 0.5, 1.0), (SHORTCUT_INPUTS, CLEAN),
                             "share of train examples with the label-revealing token"),
    "augmentation": Intervention("augmentation", lambda table, spec, level, seed, edges:
                                 with_augmentation(table, spec, level, seed), (0.0, 0.25, 0.5), (CLEAN,),
                                 "strength of word deletion and swap"),
}


def intervention(name: str) -> Intervention:
    if name not in INTERVENTIONS:
        raise LayersimError(f"unknown intervention {name!r}; valid ones are: {', '.join(INTERVENTIONS)}.")
    return INTERVENTIONS[name]


def tests_of(item: Intervention) -> dict[str, tuple[str, str]]:
    """The intervention's tests, test → (input, kind): per input, a grouping (AUPRC) and an ordering (Spearman) test;
    the main input's are named after the intervention, the others' after it and the input."""
    names = {}
    for number, inputs in enumerate(item.inputs):
        base = item.name if number == 0 else f"{item.name}_{inputs}"
        names |= {base: (inputs, "grouping"), f"{base}_order": (inputs, "ordering")}
    return names


def figure_labels(items: Sequence[Intervention]) -> dict[str, str]:
    """Each test's label in figures (layersim.reporting.grounding.ranking_figure)."""
    labels = {}
    for item in items:
        for test, (inputs, kind) in tests_of(item).items():
            on = "" if inputs == CLEAN else f", on {inputs} inputs"
            labels[test] = (f"runs of one {item.level_is} grouped (AUPRC{on})" if kind == "grouping" else
                            f"similarity falls as the {item.level_is} differs (Spearman{on})")
    return labels


def run_label(name: str, level: float, seed: int) -> str:
    return f"{name}{level:g}[{seed}]"


@dataclass
class InterventionOutputs:
    full: dict
    rows: list[dict]
    ranking: Ranking


def intervention_runs(pretrained: Path, task_dir: Path, task: str, params, plan: Mapping[str, Sequence[float]],
                      measures: Sequence[str], options: dict[str, dict], log=lambda *args: None
                      ) -> tuple[dict[str, dict[str, list[np.ndarray]]], dict[str, dict]]:
    """Each (intervention, level, seed) run of `plan` (intervention → levels): its layers on each validation input
    (run label → input → layers; the model's own head token) and its validation metrics on the clean examples; the
    `measures` (with their `options`) checked computable on these sizes first."""
    from transformers import AutoConfig

    from layersim.compute.device import resolve_device
    from layersim.data.batching import encode_task
    from layersim.data.io import read_task_table
    from layersim.data.tasks import get_task
    from layersim.experiments.extract import pooled_layers
    from layersim.models.registry import load_tokenizer
    from layersim.params.model_kind import own_head_pooling
    from layersim.similarity.registry import check_computable_on
    from layersim.training.train import finetune

    spec, device = get_task(task), resolve_device(params.device)
    tokenizer, pooling, length = load_tokenizer(pretrained), own_head_pooling(params.model), params.finetune.max_length
    train, validation = (read_task_table(task_dir, spec, split) for split in ("train", "validation"))
    width = AutoConfig.from_pretrained(pretrained).hidden_size
    for measure in measures:  # before any training
        check_computable_on(measure, validation.num_rows * max(spec.num_choices, 1), width, **options.get(measure, {}))
    edges = shortcut_edges(train, spec)
    tables = {CLEAN: validation}
    if any(SHORTCUT_INPUTS in intervention(name).inputs for name in plan):  # every example carries the token
        tables[SHORTCUT_INPUTS] = with_shortcut(validation, spec, 1.0, 0, edges)
    encoded = {which: encode_task(table, spec, tokenizer, length) for which, table in tables.items()}
    layers, metrics, trained = {}, {}, {}
    for name, levels in plan.items():
        item = intervention(name)
        for level in levels:
            for seed in params.seeds:
                key = (name, level) if level else (None, 0.0)  # level 0: the unchanged table, whatever the intervention
                if (key, seed) not in trained:
                    log("fine-tuning %s: %s %g, seed %d", task, name, level, seed)
                    changed = item.change(train, spec, level, seed, edges) if level else train
                    model, scores = finetune(pretrained, spec, encode_task(changed, spec, tokenizer, length),
                                             encoded[CLEAN], params.finetune, seed, device=device)
                    log("validation %s", ", ".join(f"{k} {v:.3f}" for k, v in scores.items()))
                    trained[key, seed] = ({which: [np.asarray(layer, dtype=np.float64) for layer in pooled_layers(
                        model.base_model, tokenizer, inputs, [pooling], params.extract.batch_size, device
                    ).layers[pooling]] for which, inputs in encoded.items()}, scores)
                label = run_label(name, level, seed)
                layers[label], metrics[label] = trained[key, seed]
    return layers, metrics


def intervention_tests(runs: Mapping[str, Mapping[str, list[np.ndarray]]], levels: Mapping[str, float],
                       item: Intervention, measures: Sequence[str], options: dict[str, dict]):
    """Every test of `item` for every measure over the runs `levels` names (run label → its level): per test and
    measure the per-layer scores (`units[test][measure]`, for :func:`rank_measures`) and every value (`full`). Only
    layer k against layer k is compared (the runs × runs matrix of each layer), not the whole stack; a layer that is
    constant across examples (the CLS row of the embeddings) has NaN scores."""
    from layersim.similarity.comparisons import number, stacked_matrix

    labels = list(levels)
    groups = [levels[label] for label in labels]
    units, full = {test: {} for test in tests_of(item)}, {measure: {} for measure in measures}
    for inputs in item.inputs:
        for measure in measures:
            # stacked_matrix: a constant layer gives NaN (scored NaN, ranked last), as in the grounding stage
            matrices = [stacked_matrix(measure, {label: [runs[label][inputs][k]] for label in labels},
                                       **options.get(measure, {})) for k in range(len(runs[labels[0]][inputs]))]
            for test, (test_inputs, kind) in tests_of(item).items():
                if test_inputs != inputs:
                    continue
                if kind == "grouping":
                    scored = [grouping_auprc(matrix, groups) for matrix in matrices]
                    scores, (_, same, different) = np.array([score for score, _, _ in scored]), scored[0]
                    entry = {"same_pairs": same, "different_pairs": different,
                             "chance": number(separation_chance(same, different))}
                else:
                    scores, entry = np.array([ordering_spearman(matrix, groups) for matrix in matrices]), {}
                units[test][measure] = scores
                full[measure][test] = {"per_layer": [number(v) for v in scores], **entry}
    return units, full


def rank_tests(units: Mapping[str, Mapping[str, Sequence[float]]], full: dict, measures: Sequence[str],
               resamples: int, seed: int) -> InterventionOutputs:
    """The measures ranked over the tests' per-layer scores, and the table's rows, best first."""
    from layersim.similarity.comparisons import number

    ranking = rank_measures(units, resamples, seed)
    rows = []
    for place, measure in enumerate(sorted(measures, key=lambda m: ranking.mean_rank[m]), 1):
        low, high = ranking.rank_interval[measure]
        row = {"measure": measure, "place": place, "mean_rank": number(ranking.mean_rank[measure]),
               "mean_rank_low": number(low), "mean_rank_high": number(high),
               "rank_top_share": number(ranking.top_share[measure])}
        for test in ranking.tests:
            low, high = ranking.interval[test][measure]
            entry = full[measure][test]
            entry |= {"score": number(ranking.score[test][measure]), "low": number(low), "high": number(high)}
            row |= {test: entry["score"], f"{test}_low": entry["low"], f"{test}_high": entry["high"]}
            if "chance" in entry:
                row[f"{test}_chance"] = entry["chance"]
        rows.append(row)
    return InterventionOutputs(full, rows, ranking)
