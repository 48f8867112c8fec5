"""What a similarity measure costs (the similarity, grounding and compare stages' share of the plan): FLOPs of one
layer pair, of one permutation of a stacked matrix's null, of a measure's observed matrix with its null and bootstrap,
and the attention similarities' (each pair of examples' maps, once a cell)."""

from __future__ import annotations

import math

from layersim.plan.cost import StageCost
from layersim.plan.sizes import ModelSize, TaskSize

CCA_FAMILY = ("svcca", "pwcca", "mean_cca")


EXACT_NULL = ("linear_cka",)  # its null's moments are exact (layersim.similarity.inference.null): no permutations
LINEAR_CKA_BLOCK_PERMUTATIONS = 199  # …while rows are exchangeable; with blocks it samples at least these
# (layersim.similarity.inference.exchangeability.LINEAR_CKA_BLOCK_PERMUTATIONS)
SMALL_PRODUCT = 1e8  # layersim.similarity._common: below rows × width² multiply-adds a product runs on one thread


ROWS_PER_DIMENSION = 10  # layersim.similarity._cca_core.ROWS_PER_DIMENSION: the CCA family's cap (max_dims "auto")


def cca_dimensions(n: int, d: int) -> int:
    """Columns of a layer's basis in the CCA family: at most max(1, ⌊(n − 1) / 10⌋) principal components
    (layersim.similarity._cca_core.dimension_cap, the measures' default max_dims "auto"), and at most its width."""
    return min(d, max(1, (n - 1) // ROWS_PER_DIMENSION))


def measure_flops(measure: str, n: int, d: int) -> float:
    """FLOPs of one layer pair's similarity on n points of width d, as the null's engines compute a cell (each layer's
    statistics once; per cell a product of the two sides and its reduction): RBF CKA's n × n kernels; the others'
    cross-products, of the d-wide layers, or for the CCA family of their bases (:func:`cca_dimensions` columns) and
    the singular values of the k × k block."""
    if measure == "rbf_cka":
        return 2 * n * n * d
    if measure in CCA_FAMILY:
        k = cca_dimensions(n, d)
        return 2 * n * k * k + 4 * k ** 3
    return 2 * n * d * d


# Linear and debiased CKA's null engines permute the stacked layers' centred n × n kernels instead of multiplying
# features when that costs less (layersim.similarity.inference._null_engines._use_gram: kept equal by
# tests/test_plan.py; the similarity package is too heavy an import for the plan).
GRAM_MEASURES = ("linear_cka", "debiased_cka")
GRAM_BYTES_LIMIT = 1 << 30  # layersim.similarity._cka_kernels.GRAM_BYTES_LIMIT
GATHER_MULTIPLY_ADDS = 30.0  # the scattered copy K[σ][:, σ] per kernel entry (upper triangles), as multiply-adds


def null_uses_gram(n: int, layers: int, d: int) -> bool:
    """Whether a CKA null over `layers` stacked layers of width d on n rows runs on the kernels (as the engine
    decides)."""
    kernel_bytes = 8.0 * 3 * layers * n * n
    gram = (layers * layers + GATHER_MULTIPLY_ADDS * layers) * n * n / 2  # the kernels' upper triangles
    return kernel_bytes <= GRAM_BYTES_LIMIT and gram < n * float(layers * d) ** 2


def stacked_layers(pairs: int) -> int:
    """The stacked layers S of an upper triangle (the diagonal included) of `pairs` cells."""
    return round((math.sqrt(8 * pairs + 1) - 1) / 2)


def engine_blocks(layers: int) -> int:
    """Blocks a product engine multiplies per permutation for the upper triangle of `layers` stacked layers: a row
    whose cells cover more than half the columns in one product against every column, the others cell by cell
    (layersim.similarity.inference._device_engines.ProductEngine.raw)."""
    return sum(layers if 2 * (layers - i) > layers else layers - i for i in range(layers))


def null_on_kernels(measure: str, n: int, d: int, pairs: int) -> bool:
    """Whether the null of `measure` over these `pairs` cells runs on the stacked layers' kernels."""
    return measure in GRAM_MEASURES and null_uses_gram(n, stacked_layers(pairs), d)


def null_flops(measure: str, n: int, d: int, pairs: int, square: bool = False) -> float:
    """FLOPs of one permutation of a stacked matrix's null over `pairs` cells (its upper triangle with the diagonal;
    with `square`, every cell of the S × S matrix, as compare tests them): for CKA on the kernels every kernel
    gathered and each pair's inner product; else the blocks the product engine multiplies (:func:`engine_blocks`)
    and each cell's reduction."""
    layers = stacked_layers(pairs)
    if null_on_kernels(measure, n, d, pairs):
        return (layers * layers + GATHER_MULTIPLY_ADDS * layers) * n * n  # 2 FLOPs an entry of the upper triangles
    return (layers * layers if square else engine_blocks(layers)) * measure_flops(measure, n, d)


def measured(measures, n: int, d: int, pairs: int, permutations: int, resamples: int = 0,
             blocks: bool = False, square: bool = False) -> StageCost:
    """`pairs` layer pairs of each measure on n points of width d, over the observed matrix, each permutation of the
    null (none for an exact null; with `blocks`, rows of one example together, linear CKA samples at least
    LINEAR_CKA_BLOCK_PERMUTATIONS) and `resamples` bootstrap cells: numpy on the host, on one thread where the
    products are small; the permutations are the nulls' engines' (analysis_flops: torch's batched float64 products,
    on the host's threads in a CPU plan, on the GPU in a GPU plan). A permutation on the kernels is one gather and
    one product for every cell at once (kernel_flops): no cell's own work (evaluations). `square`: the null tests
    every cell of the S × S stacked matrix (a measure is not symmetric in general), not only the triangle's `pairs`."""
    cost = StageCost("similarity")
    for m in measures:
        drawn = 0 if m in EXACT_NULL and not blocks else max(permutations, LINEAR_CKA_BLOCK_PERMUTATIONS) \
            if m in EXACT_NULL else permutations
        tested = stacked_layers(pairs) ** 2 if square else pairs
        engine_cells = 0 if null_on_kernels(m, n, d, pairs) else tested * drawn
        flops, null = measure_flops(m, n, d), null_flops(m, n, d, pairs, square) * drawn
        cost.add(StageCost("similarity", flops=flops * (pairs + resamples) + null,
                           evaluations=pairs + resamples + engine_cells, analysis_flops=null,
                           kernel_flops=null if null_on_kernels(m, n, d, pairs) else 0.0,
                           analysis_evaluations=engine_cells))
    cost = host(cost, n * d * d)
    # The nulls' engines multiply a batch of permutations of the whole stack at once, in torch: on its threads.
    cost.small_flops = max(0.0, cost.small_flops - cost.analysis_flops)
    return cost


def host(cost: StageCost, product: float) -> StageCost:
    """`cost` with its FLOPs numpy's on the host CPU, on one thread if its products (multiply-adds) are small."""
    cost.host_flops = cost.flops
    cost.small_flops = cost.flops if product < SMALL_PRODUCT else 0.0
    return cost


# A head measure's work per (query, key) pair and pair of heads, in a one-thread matmul's FLOPs (measured, 2-core EPYC).
ATTENTION_TERM_FLOPS = {"jensen_shannon": 650.0, "pearson": 220.0, "matrix_norm": 90.0}


def attention_partners(params, task: TaskSize, examples: int) -> float:
    """How many examples a head measure's attention null pairs each of `examples` with over its permutations, each
    pair's terms computed once a cell (layersim.similarity.inference.attention_null.HeadNullEngine): P draws within a
    class of k examples of equal length meet k(1 − (1 − 1/k)^P) of them."""
    k = 1.0 + (examples - 1) * task.length_sharing(params.finetune.max_length)
    return k * (1.0 - (1.0 - 1.0 / k) ** params.similarity.permutations)


def attention_measured(params, model: ModelSize, task: TaskSize, diagonals: int, runs: int) -> StageCost:
    """Attention similarities (layersim.similarity.inference.attention_null): each measure's stacked matrix; its null
    on the reported cells (a head measure: each pair of examples of equal length its permutations meet, once a cell);
    the bootstrap of the diagonals, ORIG–ORIG and FT–FT. Array measures over the heads: :func:`measured`."""
    s, L_, examples = params.similarity, model.shape.num_layers, min(params.extract.attention_examples, task.validation)
    stacked, examples = (1 + runs + (s.random_control is not None)) * L_, examples * task.choices
    square = task.square_units(params.extract.attention_unit, params.finetune.max_length)  # mean units² of a map
    pairs, resamples = stacked * (stacked + 1) // 2, diagonals * L_ * s.bootstrap  # (further controls have no maps)
    reported = (4 + 2 * (s.random_control is not None) + 2 * len(params.finetune.compare_methods)) * L_ * L_
    # ORIG–ORIG and FT–FT are blocks of one list of layers whose cells (i, j), (j, i) share their terms (the head
    # measures are symmetric: HeadNullEngine._key): half a block each.
    computed = reported - L_ * L_
    partners, terms = attention_partners(params, task, examples), examples * square * model.heads ** 2
    cost = StageCost("similarity")
    for m in s.attention_measures:
        if m not in ATTENTION_TERM_FLOPS:  # an array measure over the heads: (query, key) pairs as its points
            cost.add(measured([m], round(examples * square), model.heads, pairs, s.permutations, resamples, True))
            continue
        cells = pairs + computed * partners + ((diagonals + 2 * L_) * L_ if s.bootstrap else 0)
        cost.add(host(StageCost("similarity", flops=ATTENTION_TERM_FLOPS[m] * terms * cells, evaluations=pairs
                                + reported * s.permutations + (diagonals + 2 * L_) * L_ * s.bootstrap), 0.0))
    return cost
