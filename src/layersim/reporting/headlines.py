"""What goes into metrics files, and what goes into plot data.

A stage computes its full results (per layer, per cell, per span, with nulls and intervals) as one nested
dict. Its metrics file holds only the few scalars that answer the stage's question, so that experiments
read side by side in ``dvc exp show`` (DVC makes one column of every number in a metrics file); the full
dict goes, row by row, to a *details* plot data file, where ``dvc plots diff`` still compares it:

    {"metric": "cls.linear_cka.ft_orig.diagonal", "layer": 3, "value": 0.91}

``layer`` is the layer of a per-layer value (a ``layer_NN`` key, or a position in a per-layer list) and
None otherwise. :func:`details_to_metrics` turns the rows back into the full dict, and each headline
function here reads only that dict, so a metrics file can always be recomputed from its details file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from layersim.training.convergence import metrics_record, run_flags
from layersim.errors import LayersimError
from layersim.data.io import write_json
from layersim.data.layout import finetune_metrics, stage_metrics

_LAYER_KEY = re.compile(r"layer_(\d+)")


def write_metrics(full: Mapping[str, Any], headline: Mapping[str, Any], metrics: Path, details: Path) -> None:
    """Write a stage's `headline` scalars to its metrics file and every value of `full` to its details file."""
    write_json(metrics_to_details(full), details)
    write_json(headline, metrics)


# --- the details: every value, one row each ---


def metrics_to_details(full: Mapping[str, Any]) -> list[dict]:
    """Every leaf of the nested dict `full` as a row ``{"metric", "layer", "value"}`` (see the module
    docstring); dict keys are joined with ".", ``layer_NN`` keys and list positions become ``layer``."""
    rows: list[dict] = []

    def walk(value: Any, path: tuple[str, ...], layer: int | None) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                match = _LAYER_KEY.fullmatch(str(key))
                if match and layer is None:
                    walk(item, path, int(match.group(1)))
                else:
                    walk(item, (*path, str(key)), layer)
        elif isinstance(value, (list, tuple)) and layer is None:
            for position, item in enumerate(value):
                walk(item, path, position)
        else:
            rows.append({"metric": ".".join(path), "layer": layer, "value": value})

    walk(full, (), None)
    return rows


def details_to_metrics(rows: Iterable[Mapping[str, Any]]) -> dict:
    """The nested dict that :func:`metrics_to_details` came from (per-layer lists come back as
    ``layer_NN`` dicts)."""
    full: dict = {}
    for row in rows:
        *parents, leaf = row["metric"].split(".")
        node = full
        for key in parents:
            node = node.setdefault(key, {})
        if row["layer"] is None:
            node[leaf] = row["value"]
        else:
            node.setdefault(leaf, {})[f"layer_{int(row['layer']):02d}"] = row["value"]
    return full


# --- the headline scalars of each stage ---


def compared_keys(result: Mapping[str, Any]) -> list[str]:
    """The comparisons of finetune.compare_methods' runs in one measure's details (e.g. lora_orig, lora_ft): the
    comparison entries (with a ``diagonal``) keyed by a method's label in lower case
    (layersim.similarity.comparisons.phang_comparisons), then what it is compared with."""
    from layersim.data.layout import METHOD_LABELS

    methods = {label.lower() for label in METHOD_LABELS.values()}
    return [key for key, value in result.items()
            if key.rpartition("_")[0] in methods and isinstance(value, Mapping) and "diagonal" in value]


def similarity_headline(full: Mapping[str, Any], significance: float) -> dict:
    """Per pooling and measure: the FT–ORIG similarity of the top layer (``ft_orig_top``), the first
    layer whose FT–ORIG similarity is not above chance (``ft_orig_chance_from``: permutation p-value, corrected
    as ``ft_orig_chance_correction`` names, at least `significance`; None when every layer is above chance; both
    absent without a null) and the FT[1]–FT[2] similarity of the top layer (``ft1_ft2_top``, with two seeds or
    more). Attention measures the same, their null exchanging whole examples of equal length
    (layersim.similarity.inference.attention_null; details written before it: ``ft_orig_top`` only).

    The headline family: the claims these metrics state are corrected together, across every measure and
    pooling of the stage (layersim.similarity.results.correct_claims, which the similarity stage runs and whose
    ``p_family`` values and ``family`` note its details hold), not within one heatmap: ``ft_orig_chance_from``
    reads the FT–ORIG diagonal's p-values adjusted in that family, and ``<comparison>_top_p_adjusted`` gives the top
    layer's adjusted p-value of FT–ORIG, FT[1]–FT[2], ORIG–RANDOM, FT–RANDOM and the compared methods' (the page's
    above-chance marks); ``family`` says which correction and how many tests. Details without a named correction (older
    stages) keep the raw p-values.

    Seeds as the unit (layersim.similarity.inference.seeds): FT–ORIG's top layer over the seeds' models, ``ft_orig_top_seed_mean``
    and with three seeds or more ``…_seed_sd`` and the t-interval ``…_seed_ci_low``/``…_seed_ci_high``, with two
    ``…_seed_range``. With the random-init control: ``ft_orig_above_random_top``, FT–ORIG's top layer minus
    FT–RANDOM's (what an untrained network of the same architecture scores), with its paired bootstrap interval
    over examples ``…_ci_low``/``…_ci_high`` where the details hold one
    (layersim.similarity.comparison_intervals.above_random_interval; one draw of random weights), and with
    similarity.random_controls ≥ 2 its spread over the draws of random weights, ``…_controls_mean`` with ``…_sd``
    and the t-interval ``…_ci_low``/``…_ci_high`` (three controls or more) or ``…_range`` (two)
    (layersim.similarity.comparison_intervals.above_random_over_controls). With finetune.compare_methods,
    each compared method's top layer against ORIG and against FT (e.g. ``lora_orig_top``, ``lora_ft_top``: in the
    headline family, with ``…_top_p_adjusted``). Runs of different seeds (three seeds or more:
    layersim.similarity.comparison_intervals.seed_pair_spreads), each top layer's mean over the pairs with the jackknife
    interval over seeds (``…_top_ci_low``/``…_top_ci_high``): ``ft_pairs_top`` (FT[i]–FT[j]) and, per compared
    method, ``lora_ft_other_seed_top`` (LoRA[i]–FT[j ≠ i], which share no seed),
    ``lora_ft_other_seed_minus_ft_pairs_top`` (its difference from FT[i]–FT[j]) and ``lora_ft_same_seed_top``
    (LoRA[i]–FT[i], which share the head's initialisation and the data order)."""
    headline: dict = {}
    family = None
    for pooling, measures in full.items():
        if not isinstance(measures, Mapping):
            continue
        for measure, result in measures.items():
            if not (isinstance(result, Mapping) and "ft_orig" in result):
                continue
            adjusted = {key: value["p_family"] for key, value in result.items()
                        if isinstance(value, Mapping) and value.get("p_family")}
            family = result.get("family") or family
            entry = {"ft_orig_top": result["ft_orig"].get("last_layer")}
            for stat in ("seed_mean", "seed_sd", "seed_ci_low", "seed_ci_high", "seed_range"):
                if result["ft_orig"].get(stat):  # per layer: the top layer's
                    entry[f"ft_orig_top_{stat}"] = _top(result["ft_orig"][stat])
            random_top = (result.get("ft_random") or {}).get("last_layer")
            if random_top is not None and entry["ft_orig_top"] is not None:
                entry["ft_orig_above_random_top"] = round(entry["ft_orig_top"] - random_top, 6)
                above = result.get("ft_orig_above_random") or {}
                if above.get("ci_low") is not None and above.get("ci_high") is not None:
                    entry["ft_orig_above_random_top_ci_low"] = above["ci_low"]
                    entry["ft_orig_above_random_top_ci_high"] = above["ci_high"]
                controls = result.get("ft_orig_above_random_controls") or {}
                for stat in ("mean", "sd", "ci_low", "ci_high", "range"):  # over random draws (random_controls)
                    if controls.get(stat) is not None:
                        entry[f"ft_orig_above_random_top_controls_{stat}"] = controls[stat]
            if "p_value" in result["ft_orig"]:
                # Corrected in the headline family when the details name a correction.
                corrected = adjusted.get("ft_orig")
                entry["ft_orig_chance_from"] = first_layer_at_chance(
                    result["ft_orig"]["p_value"] if corrected is None else corrected, significance)
                if corrected is not None:
                    entry["ft_orig_chance_correction"] = family["correction"]
            # Attention details written before their null (no p-values) give ft_orig_top alone, as they did.
            if "ft1_ft2" in result and (pooling != "attention" or "p_value" in result["ft1_ft2"]):
                entry["ft1_ft2_top"] = result["ft1_ft2"].get("last_layer")
            for key, values in adjusted.items():
                entry[f"{key}_top_p_adjusted"] = _top(values)
            for key in compared_keys(result):  # finetune.compare_methods' runs: e.g. lora_orig_top, lora_ft_top
                entry[f"{key}_top"] = result[key].get("last_layer")
            for key, pairs in result.items():  # runs of different seeds: ft_pairs, lora_ft_other_seed, …
                if isinstance(pairs, Mapping) and {"mean", "pairs", "seeds"} <= set(pairs):
                    entry[f"{key}_top"] = _top(pairs["mean"])
                    if pairs.get("ci_low"):
                        entry[f"{key}_top_ci_low"], entry[f"{key}_top_ci_high"] = (_top(pairs["ci_low"]),
                                                                                   _top(pairs["ci_high"]))
            headline.setdefault(pooling, {})[measure] = entry
    if family:
        headline["family"] = {"correction": family["correction"], "tests": family["tests"]}
    return headline


def _top(per_layer: Mapping[str, float | None]) -> float | None:
    """The value of the highest layer of a per-layer ``{"layer_NN": value}``."""
    return per_layer[max(per_layer, key=_layer_number)]


def first_layer_at_chance(p_values: Mapping[str, float | None], significance: float) -> int | None:
    """The lowest layer whose p-value is at least `significance` (undefined layers skipped), or None."""
    for key in sorted(p_values, key=_layer_number):
        p = p_values[key]
        if p is not None and not math.isnan(p) and p >= significance:
            return _layer_number(key)
    return None


def truncate_headline(full: Mapping[str, Any]) -> dict:
    """How many top layers can be dropped with the score within tolerance of the full model: Untuned
    (the fine-tuned head as is) and Tuned (a fresh head on the exit layer)."""
    return {"untuned_droppable_top_layers": full["droppable_top_layers_untuned"],
            "tuned_droppable_top_layers": full["droppable_top_layers_tuned"]}


SKIP_PREDICTORS = {"angular": "angular_distance", "block_influence": "block_influence"}  # headline suffix → key


def skip_headline(full: Mapping[str, Any]) -> dict:
    """The length of the longest span of layers that can be skipped within tolerance (0: none); with the
    similarity predictions, ``skip_prediction_angular`` / ``…_block_influence``: the within-length Spearman rho
    (layersim.similarity.pruning.within_length) between the measured score and the droppability Gromov et al.'s
    angular distance / ShortGPT's Block Influence predict, beside its nulls, ``skip_prediction_random_layer``
    and ``…_random_layer_high`` (the mean and 97.5 % quantile of random per-layer scores' within-length rho) and
    ``skip_prediction_position_only`` (the rho of the span's depth alone, which a rule matching it says no more
    than); and ``skip_prediction_angular_beyond_position`` / ``…_block_influence_beyond_position``, the same rho
    partial on the span's position, beside its null ``skip_prediction_random_layer_beyond_position_high``
    (97.5 % quantile for random per-layer scores). None where undefined."""
    span = full.get("largest_span_within_tolerance")
    headline = {"longest_skippable_span": 0 if span is None else span["length"]}
    prediction = full.get("prediction")
    if isinstance(prediction, Mapping):
        for suffix, key in SKIP_PREDICTORS.items():
            headline[f"skip_prediction_{suffix}"] = (prediction.get(key) or {}).get("within_length")
        baselines = prediction.get("baselines") or {}
        random_layer = baselines.get("random_layer") or {}
        headline["skip_prediction_random_layer"] = random_layer.get("within_length")
        headline["skip_prediction_random_layer_high"] = random_layer.get("within_length_high")
        if "position_only" in baselines:  # details written before the position baseline have neither
            headline["skip_prediction_position_only"] = baselines["position_only"].get("within_length")
            for suffix, key in SKIP_PREDICTORS.items():
                headline[f"skip_prediction_{suffix}_beyond_position"] = (
                    (prediction.get(key) or {}).get("beyond_position"))
            headline["skip_prediction_random_layer_beyond_position_high"] = random_layer.get("beyond_position_high")
    return headline


def export_headline(full: Mapping[str, Any]) -> dict:
    """The exported model's depth against the full model's and both scores on validation (its measured speed-up is
    wall-clock: it lives in timings/export/<task>.json, outside the outputs DVC hashes)."""
    return {"layers": full["exported"]["layers"], "full_layers": full["full"]["layers"],
            "validation_full": full["full"]["validation"], "validation_exported": full["exported"]["validation"]}


def align_headline(full: Mapping[str, Any]) -> dict:
    """For the first kind of pair of align.pairs (fine-tuning seeds by default): each method's held-out
    alignment error averaged over layers and pairs (with its sd over pairs, ``<method>_sd``, when there
    are several), and ``inn_advantage`` — the best other method's error minus the INN's (positive: the
    invertible network aligns better than every other map). With align.pretraining_models, also
    ``pretraining_seeds``: per method the mean over pairs of the error before and after fine-tuning (Ren Fig. 5)
    and the injected score (Table 5), beside the references' scores."""
    kind, entry = next(iter(full["alignment_over_pairs"].items()))
    several = entry["num_pairs"] > 1
    headline = {}
    for method, stats in entry.items():
        if method in ("pairs", "num_pairs"):
            continue
        headline[method] = stats["layer_mean"]
        if several:
            headline[f"{method}_sd"] = stats["layer_mean_sd"]
    others = [error for method, error in headline.items() if method != "inn" and not method.endswith("_sd")]
    if "inn" in headline and others:
        headline["inn_advantage"] = round(min(others) - headline["inn"], 6)
    seeds = full.get("pretraining_seeds")
    if not seeds:
        return {kind: headline}
    pretraining = {f"{method}_{state}": stats["layer_mean"]
                   for state, per_method in (("before", seeds["alignment"]["pretrained"]),
                                             ("after", seeds["alignment"]["finetuned"]))
                   for method, stats in per_method.items()}
    injection = seeds["injection"]
    pretraining |= {f"injected_{name}": value["mean"]
                    for name, value in {**injection["methods"], **injection["references"]}.items()}
    return {kind: headline, "pretraining_seeds": {key.replace(" ", "_"): value for key, value in pretraining.items()}}


def compare_headline(full: Mapping[str, Any], pooling: str, measure: str) -> dict:
    """Per compared model, its mean similarity to the base model (over layers k against k) in the primary
    `pooling` and `measure`."""
    per_model = full.get(pooling, {}).get(measure, {})
    headline = {}
    for model, result in per_model.items():
        if isinstance(result, Mapping) and "diagonal" in result:
            headline[model] = _mean(result["diagonal"].values())
    return {pooling: {measure: headline}} if headline else {}


BLOCK_KEYS = {"orig_orig": "ORIG–ORIG", "ft_ft": "FT–FT"}  # the self-comparisons whose blocks are summarised


def last_block_starts(details: Mapping[str, Iterable[Mapping[str, Any]]], primary: tuple[str, str]
                      ) -> tuple[dict[str, dict[str, int | None]], int]:
    """Per task (`details`: each task's similarity details rows), the layer where the last block of layers
    starts in ORIG–ORIG and FT–FT of the `primary` (pooling, measure), None where no blocks were found;
    and the number of layers (embeddings included)."""
    pooling, measure = primary
    starts, num_layers = {}, 0
    for task, rows in details.items():
        prefix = f"{pooling}.{measure}.blocks."
        found = {row["metric"][len(prefix):]: row for row in rows if row["metric"].startswith(prefix)}
        starts[task] = {key: (found.get(f"{key}.last_block_start") or {}).get("value") for key in BLOCK_KEYS}
        layers = [row["layer"] for name, row in found.items() if name.endswith(".block_of_layer")]
        num_layers = max([num_layers, *(layer + 1 for layer in layers)])
    return starts, num_layers


def summary_headline(per_stage: Mapping[str, Mapping[str, Any]], task_metrics: Mapping[str, str],
                     primary: tuple[str, str]) -> dict:
    """One line across tasks, under ``mean``: the mean over tasks of each stage's main headline value.

    ``accuracy``, ``f1``, ``pearson``, ``mcc``, … — the fine-tuned models' task score (each task's primary
    metric, `task_metrics`, averaged over seeds), averaged over the tasks of that primary metric only, one key
    per metric: accuracy is never averaged with a correlation; ``ft_orig_top`` — the FT–ORIG top-layer similarity in the `primary` (pooling, measure);
    ``untuned_drop`` / ``tuned_drop`` — top layers droppable within tolerance; ``skip_span`` — the
    longest skippable span; ``inn_advantage`` — as in :func:`align_headline`. Short names: they are the
    columns ``dvc exp show`` compares experiments by. `per_stage` maps a stage name to ``{task: that
    task's metrics file}`` (finetune: ``{task: [one per seed]}``). Beside ``mean``, ``finetune_runs``: how
    many runs the means are over (``total``) and how many of them did not converge (``not_converged``:
    their own check or far below their seeds, :func:`layersim.training.convergence.run_flags`), which every mean
    that uses a fine-tuned model includes."""
    pooling, measure = primary
    scores: dict[str, list] = {}
    for task, runs in per_stage.get("finetune", {}).items():
        scores.setdefault(task_metrics[task], []).append(_mean(run[task_metrics[task]] for run in runs))
    wanted = {
        **dict(sorted(scores.items())),
        "ft_orig_top": [m.get(pooling, {}).get(measure, {}).get("ft_orig_top")
                        for m in per_stage.get("similarity", {}).values()],
        "untuned_drop": [m["untuned_droppable_top_layers"] for m in per_stage.get("truncate", {}).values()],
        "tuned_drop": [m["tuned_droppable_top_layers"] for m in per_stage.get("truncate", {}).values()],
        "skip_span": [m["longest_skippable_span"] for m in per_stage.get("skip", {}).values()],
        "inn_advantage": [next(iter(m.values())).get("inn_advantage") for m in per_stage.get("align", {}).values()],
    }
    summary = {"mean": {key: _mean(values) for key, values in wanted.items() if values}}
    finetuned = per_stage.get("finetune", {})
    if finetuned:
        summary["finetune_runs"] = {"total": sum(len(runs) for runs in finetuned.values()),
                                    "not_converged": sum(len(finetune_flags(runs, task_metrics[task]))
                                                         for task, runs in finetuned.items())}
    return summary


def finetune_flags(runs: Iterable[Mapping[str, Any]], metric: str) -> dict[int, str]:
    """Position among `runs` (one task's finetune metrics files, in seed order) → why that run is flagged."""
    return run_flags({k: metrics_record(run, metric) for k, run in enumerate(runs)})


def read_metrics_file(path: Path) -> Any:
    """A stage's metrics or details JSON; a missing or unreadable one is an error naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LayersimError(f"cannot read the metrics file {path} ({err}); re-run the stage that writes it.") from None


def read_stage_metrics(metrics_dir: Path, tasks: Iterable[str], seeds: Iterable[int]) -> dict:
    """The metrics files that :func:`summary_headline` reads, from `metrics_dir` as the stages write them."""
    def read(*parts: str) -> dict:
        return read_metrics_file(metrics_dir.joinpath(*parts))

    tasks, seeds = list(tasks), list(seeds)
    per_stage = {"finetune": {task: [read_metrics_file(finetune_metrics(metrics_dir / "finetune" / task, seed)) for seed in seeds] for task in tasks}}
    per_stage |= {stage: {task: read_metrics_file(stage_metrics(metrics_dir, stage, task)) for task in tasks}
                  for stage in ("similarity", "truncate", "skip", "align")}
    return per_stage


def _layer_number(key: str) -> int:
    return int(_LAYER_KEY.fullmatch(key).group(1))


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return round(sum(defined) / len(defined), 6) if defined else None
