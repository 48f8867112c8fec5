"""The report page's similarity tables, per pooling: each comparison's top layer against chance (over the
fine-tuning seeds, over examples, against the permutation null), the runs of different seeds compared
(finetune.compare_methods), and the blocks of layers. Read from the similarity stage's details; nothing is
computed here."""

from __future__ import annotations

from collections.abc import Mapping

from layersim.data.layout import METHOD_LABELS
from layersim.reporting.cells import block_spans, fmt, top_layer
from layersim.reporting.headlines import compared_keys
from layersim.reporting.html import Table

COMPARISON_NAMES = {"orig_orig": "ORIG–ORIG", "ft_orig": "FT–ORIG", "ft_ft": "FT–FT", "ft1_ft2": "FT[1]–FT[2]",
                    "ft_random": "FT–RANDOM", "orig_random": "ORIG–RANDOM"}


def comparison_name(key: str) -> str:
    """A comparison's title from its metrics key: Phang et al.'s, or a compared method's (lora_orig: LoRA–ORIG)."""
    if key in COMPARISON_NAMES:
        return COMPARISON_NAMES[key]
    method, _, other = key.rpartition("_")
    return f"{METHOD_LABELS.get(method, method)}–{other.upper()}"


# ORIG–ORIG and FT–FT diagonals compare a layer with itself: 1. FT–RANDOM beside FT–ORIG, to read it against.
DIAGONAL_COMPARISONS = ("ft_orig", "ft_random", "orig_random", "ft1_ft2")


def _over_seeds(entry: Mapping, pairs: Mapping | None = None) -> str:
    """A comparison's top layer over the seeds (layersim.similarity.inference.seeds), and over converged runs if any is not."""
    beside = (f"; converged runs only ({entry['seeds_converged']}): {fmt(top_layer(entry['seed_mean_converged']))}"
              if entry.get("seeds_converged", 99) < entry.get("seeds", 0) else "")
    if entry.get("seed_ci_low"):
        return (f"{fmt(top_layer(entry['seed_mean']))} ± {fmt(top_layer(entry['seed_sd']))} "
                f"[{fmt(top_layer(entry['seed_ci_low']))}, {fmt(top_layer(entry['seed_ci_high']))}] "
                f"({entry.get('seeds')} seeds){beside}")
    if entry.get("seed_range"):
        values = ", ".join(fmt(top_layer(v)) for v in (entry.get("seed_values") or {}).values())
        return f"{values} (range {fmt(top_layer(entry['seed_range']))}; an interval needs ≥ 3 seeds){beside}"
    if pairs:
        return _over_pairs(pairs)
    return "1 seed: no spread" if entry.get("seeds") == 1 else "–"


def _over_pairs(pairs: Mapping) -> str:
    """A comparison over pairs of runs of different seeds at the top layer: the mean, the pairs' sd, the jackknife
    interval over seeds (layersim.similarity.inference.seeds.over_seed_pairs) or why there is none."""
    text = fmt(top_layer(pairs["mean"])) + (f" ± {fmt(top_layer(pairs['sd']))}" if pairs.get("sd") else "")
    if pairs.get("ci_low"):
        return (f"{text} [{fmt(top_layer(pairs['ci_low']))}, {fmt(top_layer(pairs['ci_high']))}] over {pairs.get('pairs')} "
                f"seed pairs ({pairs.get('seeds')} seeds; jackknife over seeds: the pairs share seeds)")
    return f"{text} over {pairs.get('pairs')} seed pairs (no interval: fewer than 3 seeds)"


def seed_pair_rows(measure: str, result: Mapping) -> list[list[str]]:
    """Per compared method (finetune.compare_methods): its runs against FT's of other seeds, beside FT's seeds
    against each other, their difference, and the same-seed pairs, which share a seed (the comparisons of
    layersim.similarity.comparison_intervals.seed_pair_spreads, read at the top layer)."""
    rows = []
    for key in result:
        if not key.endswith("_ft_other_seed"):
            continue
        method = key.removesuffix("_ft_other_seed")
        label = METHOD_LABELS.get(method, method)
        for name, shares, entry in (
                ("FT[i]–FT[j], i ≠ j", "no seed", result.get("ft_pairs")),
                (f"{label}[i]–FT[j], j ≠ i", "no seed", result[key]),
                (f"{label}[i]–FT[j] − FT[i]–FT[j]", "the difference of the two above", result.get(f"{key}_minus_ft_pairs")),
                (f"{label}[i]–FT[i]", f"seed i: the head's initialisation and the order of the training data",
                 result.get(f"{method}_ft_same_seed"))):
            if entry:
                rows.append([measure, name, _over_pairs(entry), shares])
    return rows


def similarity_tables(details: Mapping, significance: float) -> list[Table]:
    """Per pooling and measure: each comparison's top-layer value over the fine-tuning seeds (mean ± sd and a
    t-interval, or the two seeds' values), then the first seed's value with its 95% interval over examples, the
    null's mean and the p-value (the last layer, as the headline metrics); then the blocks of layers."""
    tables = []
    for pooling, measures in details.items():
        if not isinstance(measures, Mapping):
            continue
        rows, block_rows, pair_rows, compared = [], [], [], False
        for measure, result in measures.items():
            if not isinstance(result, Mapping) or "ft_orig" not in result:
                continue
            pair_rows += seed_pair_rows(measure, result)
            compared = compared or bool(compared_keys(result))
            for key in (*DIAGONAL_COMPARISONS, *compared_keys(result)):  # and finetune.compare_methods' runs
                if key not in result and key in ("ft_random", "orig_random"):
                    continue  # no random-init control
                entry = result.get(key) or {}
                # Hatching's rule: the p-value corrected over the heatmap's cells (similarity.correction).
                p = top_layer(entry.get("p_adjusted") or entry.get("p_value") or {})
                rows.append([measure, comparison_name(key),
                             _over_seeds(entry, result.get("ft_pairs") if key == "ft1_ft2" else None),
                             fmt(entry.get("last_layer")),
                             _interval(entry),
                             fmt(top_layer(entry.get("null_mean") or {})), fmt(p), str(result.get("correction", "none")),
                             "–" if p is None else ("yes" if p < significance else "no: chance")])
            above = result.get("ft_orig_above_random")
            if isinstance(above, Mapping):  # the paired difference, on the same resamples of the examples
                rows.append([measure, "FT–ORIG minus FT–RANDOM", "–", fmt(above.get("value")),
                             f"[{fmt(above.get('ci_low'))}, {fmt(above.get('ci_high'))}] ({above.get('ci_method')}, "
                             "paired)", "–", "–", "–", "–"])
            controls = result.get("ft_orig_above_random_controls")
            if isinstance(controls, Mapping):  # over draws of random weights (similarity.random_controls)
                spread = (f"{fmt(controls.get('mean'))} ± {fmt(controls.get('sd'))} [{fmt(controls.get('ci_low'))}, "
                          f"{fmt(controls.get('ci_high'))}]" if controls.get("sd") is not None
                          else f"{fmt(controls.get('mean'))} (range {fmt(controls.get('range'))})")
                name = f"FT–ORIG minus FT–RANDOM over {controls.get('controls')} random-init controls"
                rows.append([measure, name, spread, "–", "–", "–", "–", "–", "–"])
            for key, blocks in (result.get("blocks") or {}).items():
                if isinstance(blocks, Mapping) and "block_of_layer" in blocks:
                    block_rows.append([measure, comparison_name(key), block_spans(blocks["block_of_layer"]),
                                       fmt(blocks.get("last_block_start")), fmt(blocks.get("contrast")),
                                       fmt(blocks.get("bootstrap_stability"))])
            seed = (result.get("blocks") or {}).get("seed_stability")
            if seed is not None:
                block_rows.append([measure, "seed 1 vs seed 2 (FT–FT)", "", "", "", f"seed agreement {fmt(seed)}"])
        if rows:
            tables.append(Table(f"{pooling}: top layer against chance", ["measure", "comparison",
                                "over seeds: mean ± sd [95% t-interval]", "FT[1]'s value",
                                "FT[1]'s 95% interval over examples (bootstrap)", "null mean", "p-value",
                                "corrected over cells by", f"above chance (p < {significance:g})"], rows,
                                "Over seeds: each seed's model in FT's place; a t-interval (n − 1 df, ≥ 3 seeds, "
                                "clipped to the range) conditional on the examples, ORIG and RANDOM's one draw; then "
                                "the mean over converged runs only if a run is flagged. The bootstrap resamples FT[1]'s"
                                " examples alone. RANDOM: random-init weights. The null shuffles the rows of one side: "
                                "what unrelated representations of this size score; a value near its null mean says "
                                "nothing about the layers. The p-value is corrected over the heatmap's cells "
                                "(fdr_bh: Benjamini–Hochberg q; holm: Holm-adjusted p; none: per cell)."
                                + (" A compared method against FT (e.g. LoRA–FT) is its first run against FT[1]: the "
                                   "two share seed 1, so the head's initialisation and the data order"
                                   + ("; see the runs of different seeds below." if pair_rows else
                                      " (with 3 seeds or more, runs of different seeds are compared too).")
                                   if compared else "")))
        if pair_rows:
            tables.append(Table(f"{pooling}: runs of different seeds, top layer", [
                "measure", "comparison", "mean over seed pairs ± sd [95% interval]", "the two runs share"], pair_rows,
                "Run i of every method is fine-tuned with seed i: LoRA[i] and FT[i] share the head's initialisation and "
                "the order of the training data, so LoRA[i]–FT[i] (and the heatmaps' LoRA–FT, LoRA[1]–FT[1]) may be "
                "close for that reason alone. LoRA[i]–FT[j ≠ i] shares no seed: read it beside FT[i]–FT[j], how close "
                "full fine-tuning's own seeds end. The interval is the jackknife over seeds (each seed left out with "
                "every pair that uses it; t with n − 1 df), as pairs that share a seed are not independent."))
        if block_rows:
            tables.append(Table(f"{pooling}: blocks of layers", ["measure", "matrix", "blocks (layers)",
                                "last block starts", "within − between", "stability (bootstrap)"], block_rows,
                                "One block: no contrast above 0.05 between within- and between-block similarity."))
    return tables


def _interval(entry: Mapping) -> str:
    """The top layer's interval over examples, with the bootstrap method and, when the interval excludes the
    value itself (resamples all on one side of it), the bias-corrected value it is built around."""
    low, high = top_layer(entry.get("ci_low") or {}), top_layer(entry.get("ci_high") or {})
    if low is None or high is None:
        return "–"
    text = f"[{fmt(low)}, {fmt(high)}]" + (f" ({entry['ci_method']})" if entry.get("ci_method") else "")
    value, centre = entry.get("last_layer"), top_layer(entry.get("ci_centre") or {})
    if value is not None and centre is not None and not low <= value <= high:
        text += f"; bias-corrected value {fmt(centre)}: the resamples lie on one side of {fmt(value)}"
    return text
