"""Every number the similarity and compare stages report, as plain result objects: each stacked matrix
(layersim.similarity.comparisons) with its null, the p-values corrected over each heatmap and the cells they
leave at chance, the bootstrap intervals of the reported diagonals, the blocks of layers and how stable they
are, the spread over seed pairs and the dimensions a CCA measure kept. layersim.reporting.similarity turns
these into metrics, plot rows and figures without computing any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity.blocks import Blocks, find_blocks, stability
from layersim.similarity.attention import AttentionMaps
from layersim.similarity.inference.attention_null import (attention_bootstrap_pairs, attention_stacked_null,
                                                          attention_unmovable)
from layersim.similarity.inference.bootstrap import bootstrap_pairs, chosen_interval, no_interval_note
from layersim.similarity.cca import CAPPED_MEASURES, bases_reused, kept_dimensions
from layersim.similarity.cka import is_constant
from layersim.similarity.comparison_intervals import (above_random_interval, diagonal_intervals, seed_pair_spreads,
                                                      seed_spread)
from layersim.similarity.comparisons import (PHANG_KEYS, RANDOM, Comparison, block, compared_labels,
                                             localization, measure_options, phang_cells, phang_comparisons,
                                             stacked_null)
from layersim.similarity.inference.correction import (adjusted_p_values, at_chance, cells_needed, declares,
                                            permutations_needed, self_comparison_cells)
from layersim.similarity.inference.exchangeability import unmovable
from layersim.similarity.kernels import RBF_EXACT_MAX_ROWS
from layersim.similarity.moments import MOMENT_MEASURES
from layersim.similarity.registry import MEASURES
from layersim.similarity.inference.null import NullMatrix
from layersim.similarity.inference.seeds import PairSpread

# The comparisons whose matrices are segmented into blocks of layers (Phang et al.'s block-diagonal
# structure): one model's layers against themselves, and the two seeds' (symmetrised).
BLOCK_COMPARISONS = ("orig_orig", "ft_ft", "ft1_ft2")


@dataclass(frozen=True)
class Uncertainty:
    """How every reported value is qualified: its permutation null, and a bootstrap interval for diagonals."""

    permutations: int = 100      # sampled permutations per cell (linear CKA uses exact moments instead)
    bootstrap: int = 200         # resamples of the examples; 0 computes no interval
    seed: int = 0
    significance: float = 0.05   # cells with a corrected p ≥ this are drawn hatched: not above chance
    adjusted: bool = False       # also report the chance-adjusted diagonal
    correction: str = "fdr_bh"   # over each heatmap's tested cells (layersim.similarity.inference.correction)

    def corrected(self, p_values: np.ndarray, tested: np.ndarray | None = None,
                  symmetric: bool = False) -> np.ndarray:
        """`p_values` of one heatmap's cells, corrected over its `tested` ones (default all; NaN for the others,
        a symmetric pair counted once: layersim.similarity.inference.correction.adjusted_p_values)."""
        return adjusted_p_values(p_values, self.correction, tested, symmetric)

    def at_chance(self, p_values: np.ndarray, tested: np.ndarray | None = None,
                  symmetric: bool = False) -> np.ndarray:
        """The tested cells of one heatmap not above chance (drawn hatched): corrected p ≥ significance."""
        return at_chance(p_values, self.correction, self.significance, tested, symmetric)

    def check_reach(self, cells: int, measures: Sequence[str], what: str) -> str | None:
        """Before any permutation: refuse when the correction can declare no cell of a heatmap of `cells` cells
        with this many draws (Holm, whose first step needs 1/(permutations + 1) < significance/cells), and
        return a warning when only many cells at the smallest p-value together can be (BH); `measures`: those
        with a sampled null (permutations or rotations; linear CKA's exact null gives continuous p-values)."""
        draws, level, method = self.permutations, self.significance, self.correction
        if not measures or declares(method, level, draws, cells):
            return None
        if not declares(method, level, draws, cells, cells):
            raise LayersimError(
                f"{what}: similarity.correction = {method} over the {cells} cells of a heatmap needs "
                f"similarity.permutations ≥ {permutations_needed(method, level, cells, cells)} for any cell of "
                f"{', '.join(measures)} to be above chance (their smallest p-value is 1/(permutations + 1)), but "
                f"it is {draws}; raise it, or use fdr_bh.")
        return (f"{what}: with {method} over the {cells} cells of a heatmap and {draws} permutations, a cell of "
                f"{', '.join(measures)} is above chance only together with at least "
                f"{cells_needed(method, level, draws, cells) - 1} others at the smallest p-value 1/{draws + 1}; a "
                f"lone cell needs {permutations_needed(method, level, cells)} permutations")


def settings(p) -> tuple[dict[str, dict], Uncertainty]:
    """The measures' options and the Uncertainty from params.yaml's similarity section (SimilarityParams)."""
    options = measure_options(rbf_sigma_scale=p.rbf_sigma_scale, svcca_variance=p.svcca_variance,
                              pwcca_variance=p.pwcca_variance, rbf_exact_max_rows=p.rbf_exact_max_rows,
                              rbf_landmarks=p.rbf_landmarks, seed=p.seed)
    options |= {"shape_metric": {"alpha": p.shape_alpha}, "rsa": {"rdm": p.rsa_rdm, "compare": p.rsa_compare},
                "knn_jaccard": {"k": p.knn_k, "metric": p.knn_metric}, "gulp": {"ridge": p.gulp_ridge}}
    options |= {name: {"k": p.knn_k} for name in ("mutual_knn", "rank_similarity", "second_order_cosine", "cknna")}
    return options, Uncertainty(p.permutations, p.bootstrap, p.seed, p.significance, p.chance_adjusted, p.correction)


def null_unavailable(measure: str, num_rows: int, options: dict) -> str | None:
    """Why `measure` gets neither a null nor bootstrap intervals on `num_rows` examples, or None: above its
    exact_max_rows RBF CKA is Nyström-approximated, and its null engine holds exact n x n kernels; a difference of
    summaries (Measure.no_null) has none on any number of rows."""
    if measure in MEASURES and MEASURES[measure].no_null:
        return MEASURES[measure].no_null
    limit = options.get("exact_max_rows", RBF_EXACT_MAX_ROWS)
    if measure != "rbf_cka" or num_rows <= limit:
        return None
    return (f"RBF CKA on {num_rows} rows is Nyström-approximated (above similarity.rbf_exact_max_rows = {limit}); "
            "a null or interval would need the exact n x n kernels or the approximation redone for every draw")


def sampled_null_measures(measures: Sequence[str], num_rows: int, options: dict[str, dict],
                          streamed: bool = False) -> list[str]:
    """The measures whose null is sampled, so that their p-values are at least 1/(permutations + 1): not linear
    CKA (exact moments), nor those without a null (debiased CKA streamed, RBF CKA above its exact_max_rows);
    streamed, the rotation null of the measures computed from moments."""
    if streamed:
        return [m for m in measures if m in MOMENT_MEASURES]
    return [m for m in measures if m != "linear_cka" and not null_unavailable(m, num_rows, options.get(m, {}))]


def reach_warning(uncertainty: Uncertainty, measures: Sequence[str], num_rows: int, options: dict[str, dict],
                  cells: int, what: str, streamed: bool = False) -> str | None:
    """:meth:`Uncertainty.check_reach` for a heatmap of `cells` cells of `measures` on `num_rows` examples."""
    return uncertainty.check_reach(cells, sampled_null_measures(measures, num_rows, options, streamed), what)


def layer_blocks(matrix: np.ndarray) -> Blocks | None:
    """The blocks of a layer × layer matrix (layersim.similarity.blocks) over its defined layers (a layer
    that is constant for every example, e.g. CLS at the embeddings, has no similarity and joins no block),
    in the matrix's layer numbering; None when fewer than two layers are defined."""
    kept = np.flatnonzero(np.isfinite(np.diag(matrix)))
    sub = matrix[np.ix_(kept, kept)]
    if len(kept) < 2 or not np.isfinite(sub).all():
        return None
    found = find_blocks(sub)
    return Blocks(tuple(int(kept[start]) for start in found.starts), int(kept[-1]) + 1, found.within, found.between)


def kept_dimensions_per_layer(models: dict[str, list], measure: str, **options) -> dict[str, list[int | None]]:
    """How many dimensions a CCA measure compared, per model and layer (None for a constant layer): after the
    rank, variance and `max_dims` cuts, what each value is computed from."""
    return {label: [None if is_constant(layer) else kept_dimensions(layer, measure, **options) for layer in layers]
            for label, layers in models.items()}


def finetuned_labels(sizes: dict[str, int]) -> list[str]:
    """finetune.method's fine-tuned models among the stacked ones (FT[1], FT[2], …): not ORIG, the random-init
    control or the runs of finetune.compare_methods (layersim.similarity.comparisons.compared_labels)."""
    compared = {label for runs in compared_labels(sizes).values() for label in runs}
    return [label for label in sizes if label not in ("ORIG", RANDOM) and label not in compared]


@dataclass
class MeasureResult:
    """One measure's Phang et al. comparisons, with what qualifies them."""

    measure: str
    matrix: np.ndarray                       # the stacked matrix, layers of the models of `sizes` in order
    comparisons: list[Comparison]            # corrected p-values and cells at chance; diagonal intervals
    null: NullMatrix | None = None           # the stacked null the comparisons' cells come from
    unavailable: str | None = None           # why there is no null and no interval (layersim.similarity.results)
    blocks: dict[str, Blocks | None] = field(default_factory=dict)  # by comparison key (BLOCK_COMPARISONS)
    bootstrap_stability: dict[str, float] = field(default_factory=dict)  # Rand index of blocks over resamples
    seed_stability: float | None = None      # do the other seeds' FT–FT matrices split the same way?
    kept_dimensions: dict[str, list[int | None]] | None = None
    seed_spread: tuple[np.ndarray, np.ndarray] | None = None  # FT[i]–FT[j] diagonals' mean and sd (> 2 seeds)
    # Pairs of runs of different seeds, with jackknife intervals over seeds (> 2 seeds): comparison_intervals.seed_pair_spreads
    pair_spreads: dict[str, PairSpread] = field(default_factory=dict)
    no_interval: str | None = None           # why the diagonals have no bootstrap interval, when they have none
    above_random: dict | None = None         # FT–ORIG's top minus FT–RANDOM's, paired interval (above_random_interval)


def phang_result(measure: str, matrix: np.ndarray, sizes: dict[str, int], *, models: dict[str, list] | None = None,
                 null: NullMatrix | None = None, uncertainty: Uncertainty | None = None,
                 groups: np.ndarray | None = None, strata: np.ndarray | None = None,
                 options: dict | None = None, null_rows: np.ndarray | None = None) -> MeasureResult:
    """`matrix` (stacked, the models of `sizes`: ORIG, then FT[1], FT[2], …) as Phang et al.'s comparisons.

    With `uncertainty` and the `models`' layers in memory, every reported cell's permutation null here and a
    bootstrap interval of the FT–ORIG and FT[1]–FT[2] diagonals over examples (over `groups` of rows: the words
    of one example are resampled together, and permuted together within their `strata`:
    layersim.similarity.inference.exchangeability); otherwise the `null` given (e.g. from streamed moments), if any.
    Layers that are :class:`AttentionMaps` (attention measures) get the attention null and intervals
    (layersim.similarity.inference.attention_null: whole examples onto examples of equal length, `groups` then each
    example's cluster), no above-random interval.
    `null_rows`: the rows the null is computed on, its observed values too (coarser length classes:
    exchangeability.length_class_rows); None: every row. Each layer of a CCA measure is whitened once for all of
    these (layersim.similarity.cca.bases_reused)."""
    with bases_reused():
        return _phang_result(measure, matrix, sizes, models, null, uncertainty, groups, strata, options or {},
                             null_rows)


def _phang_result(measure: str, matrix: np.ndarray, sizes: dict[str, int], models: dict[str, list] | None,
                  null: NullMatrix | None, uncertainty: Uncertainty | None, groups: np.ndarray | None,
                  strata: np.ndarray | None, options: dict, null_rows: np.ndarray | None) -> MeasureResult:
    orig, finetuned = "ORIG", finetuned_labels(sizes)
    unavailable = None
    attention = models is not None and isinstance(next(iter(models.values()))[0], AttentionMaps)
    if attention and uncertainty is not None:  # whole examples of equal length, clusters (`groups`) as blocks
        first = next(iter(models.values()))[0]
        unavailable = null_unavailable(measure, first.num_pairs, options) or attention_unmovable(first, groups)
        if not unavailable:
            null = attention_stacked_null(measure, models, permutations=uncertainty.permutations,
                                          seed=uncertainty.seed, cells=phang_cells(sizes, orig, finetuned),
                                          clusters=groups, **options)
    elif models is not None and uncertainty is not None:
        tested, tested_groups, tested_strata = models, groups, strata
        if null_rows is not None:
            tested = {label: [layer[null_rows] for layer in layers] for label, layers in models.items()}
            tested_groups, tested_strata = (None if labels is None else np.asarray(labels)[null_rows]
                                            for labels in (groups, strata))
        num_rows = len(next(iter(tested.values()))[0])
        unavailable = (null_unavailable(measure, num_rows, options)
                       or unmovable(num_rows, tested_groups, tested_strata))
        if not unavailable:
            null = stacked_null(measure, tested, permutations=uncertainty.permutations, seed=uncertainty.seed,
                                cells=phang_cells(sizes, orig, finetuned), groups=tested_groups,
                                strata=tested_strata, **options)
    symmetric = measure in MEASURES and MEASURES[measure].symmetric
    comparisons = [_corrected(c, uncertainty, symmetric)
                   for c in phang_comparisons(matrix, sizes, orig, finetuned, null)]
    resampled = {}
    if models is not None and uncertainty is not None and not unavailable and uncertainty.bootstrap:
        comparisons, resampled = diagonal_intervals(
            measure, models, comparisons, resamples=uncertainty.bootstrap, seed=uncertainty.seed, groups=groups,
            whole=("orig_orig", "ft_ft"), bootstrap=attention_bootstrap_pairs if attention else bootstrap_pairs,
            **options)
    result = MeasureResult(measure, matrix, comparisons, null, unavailable,
                           {c.key: layer_blocks(c.matrix) for c in comparisons if c.key in BLOCK_COMPARISONS})
    bootstrapped = models is not None and uncertainty is not None and not unavailable and uncertainty.bootstrap
    if bootstrapped and chosen_interval(measure, "auto") is None:
        result.no_interval = no_interval_note(measure)
    if bootstrapped and not attention:
        result.above_random = above_random_interval(measure, models, resamples=uncertainty.bootstrap,
                                                    seed=uncertainty.seed, groups=groups, **options)
    for key, per_resample in resampled.items():
        if result.blocks.get(key) is not None:
            # How far bootstrap resamples of the examples split the layers the same way (Rand index).
            again = [layer_blocks(m) for m in per_resample]
            again = [b for b in again if b is not None and b.num_layers == result.blocks[key].num_layers]
            if again:
                result.bootstrap_stability[key] = stability(result.blocks[key], again)
    if len(finetuned) > 1 and result.blocks.get("ft_ft") is not None:
        others = [layer_blocks(block(matrix, sizes, label, label)) for label in finetuned[1:]]
        if all(other is not None for other in others):
            result.seed_stability = stability(result.blocks["ft_ft"], others)
    if null is not None and measure in CAPPED_MEASURES and models is not None and not attention:
        result.kept_dimensions = kept_dimensions_per_layer(models, measure, **options)
    if len(finetuned) > 2:
        result.seed_spread = seed_spread(matrix, sizes, finetuned)
        result.pair_spreads = seed_pair_spreads(matrix, sizes, finetuned,
                                                MEASURES[measure].bounded if measure in MEASURES else None)
    return result


# The comparisons of a model's layers with themselves: a layer against itself is no test (correction module).
SELF_COMPARISONS = ("orig_orig", "ft_ft")


def _corrected(c: Comparison, uncertainty: Uncertainty | None, symmetric: bool = False) -> Comparison:
    """The comparison with its p-values corrected over its tested cells: one heatmap, one family of tests, without
    a layer against itself (the self-comparisons' diagonal) and, for a `symmetric` measure, each pair of layers of a
    self-comparison once."""
    if c.p_value is None or uncertainty is None:
        return c
    selves = c.key in SELF_COMPARISONS
    family = {"tested": self_comparison_cells(len(c.p_value)), "symmetric": symmetric} if selves else {}
    return dataclasses.replace(c, p_adjusted=uncertainty.corrected(c.p_value, **family),
                               at_chance=uncertainty.at_chance(c.p_value, **family))


def localization_of(matrices: dict[str, np.ndarray], sizes: dict[str, int], style: str,
                    trained: Sequence[str] | None = None) -> dict[str, np.ndarray] | None:
    """Wu et al.'s localization score per trained model and layer (`style` "raw" or "zscore") from stacked
    neuronsim and SVCCA matrices, or None when either measure was not computed. `trained`: the models averaged
    over and scored (default all), the random-init controls left out as Wu et al. do."""
    if not {"neuronsim", "svcca"} <= set(matrices):
        return None
    return localization(matrices["neuronsim"], matrices["svcca"], sizes, standardize=style == "zscore",
                        trained=trained)


def trained_labels(sizes: dict[str, int]) -> list[str]:
    """The trained models among those of the similarity stage: ORIG and finetune.method's runs (FT[i]), not the
    random-init control, nor the runs of finetune.compare_methods (adding a method changes no score of the others)."""
    return ["ORIG", *finetuned_labels(sizes)] if "ORIG" in sizes else finetuned_labels(sizes)


# The comparisons whose top layer the report marks above chance or not; FT–ORIG's whole diagonal is read too. The
# comparisons of finetune.compare_methods' runs (e.g. lora_orig, lora_ft: headlines lora_orig_top, lora_ft_top)
# join them: :func:`headline_comparisons`.
HEADLINE_COMPARISONS = ("ft_orig", "ft1_ft2", "orig_random", "ft_random")


def headline_comparisons(result: dict) -> list[str]:
    """The comparisons of one measure's summary whose claims the headline states: :data:`HEADLINE_COMPARISONS` and
    every comparison of a compared method's run (any comparison entry, with a ``diagonal``, that is not one of
    Phang et al.'s: layersim.similarity.comparisons.PHANG_KEYS)."""
    compared = [key for key, value in result.items()
                if key not in PHANG_KEYS and isinstance(value, dict) and "diagonal" in value]
    return [*HEADLINE_COMPARISONS, *compared]


def correct_claims(metrics: dict, correction: str) -> int:
    """The similarity stage's headline claims corrected as one family, in place: every FT–ORIG diagonal layer and
    the top layer of FT[1]–FT[2], ORIG–RANDOM, FT–RANDOM and of each compared method's comparisons (LoRA–ORIG,
    LoRA–FT: :func:`headline_comparisons`), of every measure with a null and every pooling of
    `metrics` ({pooling: {measure: summary}}, as layersim.reporting.similarity summarises them). Each such
    comparison gains ``p_family`` ({"layer_NN": adjusted p}) and each measure ``family`` (the correction and the
    family's size), which the headline metrics read; a heatmap's own correction (``p_adjusted``) is unchanged.
    Returns the number of tests in the family."""
    cells = []
    for pooling, measures in metrics.items():
        if not isinstance(measures, dict):
            continue
        for result in measures.values():
            if not (isinstance(result, dict) and "ft_orig" in result and "p_value" in result["ft_orig"]):
                continue
            for key in headline_comparisons(result):
                p_values = (result.get(key) or {}).get("p_value") or {}
                layers = sorted(p_values)  # "layer_NN": zero-padded, so sorted by number
                for layer in layers if key == "ft_orig" else layers[-1:]:
                    if p_values[layer] is not None:
                        cells.append((result, key, layer, float(p_values[layer])))
    if not cells:
        return 0
    adjusted = adjusted_p_values(np.array([cell[-1] for cell in cells]), correction)
    tests = int(np.isfinite(adjusted).sum())
    for (result, key, layer, _), value in zip(cells, adjusted):
        result[key].setdefault("p_family", {})[layer] = None if np.isnan(value) else round(float(value), 6)
    for result in {id(cell[0]): cell[0] for cell in cells}.values():
        result["family"] = {"correction": correction, "tests": tests}
    return tests
