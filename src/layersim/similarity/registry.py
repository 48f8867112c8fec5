"""The similarity measures by name, and the all-pairs layer × layer matrix for any of them.

::

    similarity_matrix("svcca", layers)                     # (L, L), symmetric, diagonal 1
    similarity_matrix("neuronsim", ft_layers, orig_layers)  # (L_ft, L_orig): neuronsim(ft_i, orig_j)

Every matrix computes each layer's statistics once (centred data, orthonormal bases, standardised
neurons, kernels) and only cheap per-pair work after that; entry [i, j] equals the pair function
on ``(xs[i], ys[j])``. With ``ys=None`` the layers are compared with themselves: symmetric measures
compute the upper triangle only, asymmetric ones every ordered pair (sharing work between [i, j]
and [j, i] where the measure allows), and the diagonal is exactly 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError, unknown_name
import layersim.similarity.aligned as aligned
import layersim.similarity.cca as cca
import layersim.similarity.cka as cka
import layersim.similarity.kernels as kernels
import layersim.similarity.knn_measures as knn_measures
import layersim.similarity.matching as matching
import layersim.similarity.neighbours as neighbours
import layersim.similarity.neurons as neurons
import layersim.similarity.rsa as rsa
import layersim.similarity.rsm as rsm
import layersim.similarity.shape as shape
import layersim.similarity.subspaces as subspaces
import layersim.similarity.summaries as summaries
from layersim.similarity._common import check_options
from layersim.similarity.inference._host_engines import recomputed_engine
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.cka import cka_matrix


@dataclass(frozen=True)
class Measure:
    """A similarity measure between ``(num_examples x hidden)`` representations.

    ``pair(x, y, **options)`` gives one value, ``matrix(xs, ys=None, **options)`` all pairs;
    ``options`` are the keyword options both accept. ``bounded`` is the (lo, hi) range of values, or
    None when unbounded. ``symmetric`` says whether ``pair(x, y) == pair(y, x)``; for an asymmetric
    measure the first argument is the side averaged over (its neurons, or its PWCCA weights).
    ``min_rows`` is the fewest examples the measure accepts; ``check_sizes(num_rows, width, name)``,
    where set, raises a LayersimError when a layer of that width cannot be compared on that many
    examples (see :func:`check_computable`). ``null_engine``, where set, builds the measure's permutation-null
    engine (:mod:`layersim.similarity.inference._null_engines`' contract), which also gives its bootstrap intervals; the
    measures of Wu et al.'s study have theirs in that module's ``ENGINES``, and a measure with neither gets the generic
    :class:`~layersim.similarity.inference._host_engines.RecomputedEngine` (its matrix recomputed on each
    permutation's rows: exact, but a whole matrix per draw). ``no_null``, where set, says why the measure has no
    permutation null (nor bootstrap interval) at all: ReSi's difference statistics compare one summary per layer,
    which a permutation of the examples leaves unchanged; the stages report that sentence instead of a null, and
    :func:`~layersim.similarity.permutation_matrix` refuses such a measure.

    Every measure is a similarity (larger: more alike, 1 for a layer against itself), which the nulls' one-sided
    p-values, the blocks and the plots assume; a distance is reported through a decreasing function of it
    (``procrustes``, ``shape_metric``: :mod:`layersim.similarity.shape` names both distances; ``size_and_shape``,
    ``gulp``: ``1 − d² / (a normaliser a permutation of the rows leaves alone)``; the differences of summaries:
    ``1 / (1 + δ)``; each module's docstring gives the map and its inverse).
    """

    name: str
    label: str
    symmetric: bool
    bounded: tuple[float, float] | None
    pair: Callable[..., float]
    matrix: Callable[..., np.ndarray]
    options: tuple[str, ...] = ()
    level: str = "representation"  # "neuron", "mixed" or "representation" (Wu et al.'s groups)
    min_rows: int = 2
    check_sizes: Callable[[int, int, str], None] | None = None
    null_engine: Callable[..., object] | None = None
    no_null: str | None = None


def _linear_cka(x: np.ndarray, y: np.ndarray, *, method: str = "auto") -> float:
    """:func:`layersim.similarity.linear_cka` with cka_matrix's ``method`` option."""
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    return float(cka._cka([("x", x)], [("y", y)], method=method)[0, 0])


MEASURES: dict[str, Measure] = {
    m.name: m
    for m in [
        Measure("linear_cka", "linear CKA", True, (0.0, 1.0), _linear_cka, cka_matrix, ("method",)),
        Measure("rbf_cka", "RBF CKA", True, (0.0, 1.0), kernels.rbf_cka, kernels.rbf_cka_matrix,
                ("exact_max_rows", "landmark_seed", "landmarks", "sigma_scale")),
        Measure("debiased_cka", "debiased linear CKA", True, (-1.0, 1.0), kernels.debiased_cka,
                kernels.debiased_cka_matrix, ("method",), min_rows=4),
        Measure("svcca", "SVCCA", True, (0.0, 1.0), cca.svcca, cca.svcca_matrix,
                ("max_dims", "rtol", "variance_threshold")),
        Measure("pwcca", "PWCCA", False, (0.0, 1.0), cca.pwcca, cca.pwcca_matrix,
                ("max_dims", "method", "rtol", "variance_threshold")),
        Measure("mean_cca", "mean CCA R²", True, (0.0, 1.0), cca.mean_cca_r2, cca.mean_cca_matrix,
                ("max_dims", "method", "rtol")),
        Measure("neuronsim", "neuronsim", False, (0.0, 1.0), neurons.neuronsim, neurons.neuronsim_matrix, (),
                level="neuron"),
        Measure("mixedsim", "mixedsim", False, (0.0, 1.0), neurons.mixedsim, neurons.mixedsim_matrix,
                ("method", "rtol"), level="mixed", check_sizes=neurons.check_mixedsim_sizes),
        # The peers' measures (Williams et al.'s netrep, rsatoolbox, Klabunde et al.'s survey), as similarities.
        Measure("procrustes", "Procrustes similarity", True, (0.0, 1.0), shape.procrustes, shape.procrustes_matrix,
                null_engine=shape.procrustes_engine),
        Measure("shape_metric", "shape metric (cos θ)", True, (0.0, 1.0), shape.shape_similarity,
                shape.shape_matrix, ("alpha",), null_engine=shape.shape_engine),
        Measure("rsa", "RSA", True, (-1.0, 1.0), rsa.rsa, rsa.rsa_matrix, ("compare", "rdm"), min_rows=3,
                check_sizes=rsa.check_rsa_sizes, null_engine=rsa.rsa_engine),
        Measure("knn_jaccard", "k-NN Jaccard", True, (0.0, 1.0), neighbours.knn_jaccard,
                neighbours.knn_jaccard_matrix, ("k", "metric"), min_rows=3, null_engine=neighbours.knn_engine),
        # ReSi's measures (Klabunde et al. 2025) and the platonic-representation work's (Huh et al. 2024):
        # docs/peers.md.
        Measure("distance_correlation", "distance correlation", True, (0.0, 1.0), rsm.distance_correlation,
                rsm.distance_correlation_matrix, min_rows=3, check_sizes=rsm.check_distance_sizes,
                null_engine=rsm.distance_correlation_engine),
        Measure("rsm_norm", "RSM norm similarity (Frobenius)", True, (0.0, 1.0), rsm.rsm_norm, rsm.rsm_norm_matrix,
                check_sizes=rsm.check_distance_sizes, null_engine=rsm.rsm_norm_engine),
        *[Measure(f.pair.__name__, label, True, bounded, f.pair, f.matrix, ("k",), min_rows=3, null_engine=f.engine)
          for f, label, bounded in [(knn_measures.MUTUAL_KNN, "mutual k-NN", (0.0, 1.0)),
                                    (knn_measures.RANK_SIMILARITY, "rank similarity", (0.0, 1.0)),
                                    (knn_measures.SECOND_ORDER_COSINE, "second-order cosine", (-1.0, 1.0)),
                                    (knn_measures.CKNNA, "CKNNA", (-1.0, 1.0))]],
        # ReSi's (Klabunde et al. 2025) measures, by their definitions (docs/peers.md says where ReSi's code differs).
        Measure("linear_regression", "linear regression R²", False, (0.0, 1.0), subspaces.linear_regression,
                subspaces.linear_regression_matrix, ("method", "rtol"), min_rows=3,
                check_sizes=subspaces.check_linear_regression_sizes, null_engine=subspaces.linear_regression_engine),
        Measure("size_and_shape", "size-and-shape Procrustes", True, (0.0, 1.0), aligned.size_and_shape,
                aligned.size_and_shape_matrix, null_engine=aligned.size_and_shape_engine),
        Measure("aligned_cosine", "aligned cosine", True, (-1.0, 1.0), aligned.aligned_cosine,
                aligned.aligned_cosine_matrix, null_engine=aligned.aligned_cosine_engine),
        Measure("hard_correlation_match", "hard correlation match", True, (-1.0, 1.0), matching.hard_correlation_match,
                matching.hard_correlation_match_matrix, level="neuron",
                null_engine=matching.hard_correlation_match_engine),
        Measure("soft_correlation_match", "soft correlation match", True, (-1.0, 1.0), matching.soft_correlation_match,
                matching.soft_correlation_match_matrix, level="neuron",
                null_engine=matching.soft_correlation_match_engine),
        Measure("gulp", "GULP", True, (0.0, 1.0), subspaces.gulp, subspaces.gulp_matrix, ("ridge", "rtol"),
                null_engine=subspaces.gulp_engine),
        Measure("eigenspace_overlap", "eigenspace overlap", True, (0.0, 1.0), subspaces.eigenspace_overlap,
                subspaces.eigenspace_overlap_matrix, ("method", "rtol"), min_rows=3,
                check_sizes=subspaces.check_eigenspace_sizes, null_engine=subspaces.eigenspace_overlap_engine),
        Measure("magnitude_difference", "magnitude difference", True, (0.0, 1.0), summaries.magnitude_difference,
                summaries.magnitude_difference_matrix, no_null=summaries.NO_NULL),
        Measure("concentricity_difference", "concentricity difference", True, (0.0, 1.0),
                summaries.concentricity_difference, summaries.concentricity_difference_matrix,
                no_null=summaries.NO_NULL),
        Measure("uniformity_difference", "uniformity difference", True, (0.0, 1.0), summaries.uniformity_difference,
                summaries.uniformity_difference_matrix, no_null=summaries.NO_NULL),
    ]
}
# Their null engines join the others', where null and bootstrap look them up by name; a measure without one gets
# the generic engine, its matrix recomputed on the permuted rows (exact, one matrix per permutation); a measure that
# has no null (no_null) gets none.
ENGINES.update({m.name: m.null_engine for m in MEASURES.values() if m.null_engine is not None})
for _measure in MEASURES.values():
    if _measure.no_null is None:
        ENGINES.setdefault(_measure.name, recomputed_engine(_measure.matrix))


def get_measure(name: str) -> Measure:
    """The :class:`Measure` called ``name``; an unknown name raises a LayersimError listing the valid ones."""
    if name not in MEASURES:
        raise unknown_name("similarity measure", name, MEASURES)
    return MEASURES[name]


def check_computable(name: str, num_rows: int, widths: int | Sequence[int] | Mapping[str, int]) -> None:
    """Raise a LayersimError, before any data are loaded, if the measure ``name`` cannot be computed
    on ``num_rows`` examples for layers of these widths; return None if it can.

    Cheap (sizes only), for a stage to call before any work and for parameter validation once the
    sizes are known. Today: every measure needs 2 examples (debiased_cka 4, rsa and knn_jaccard 3), mixedsim and
    linear_regression need ``num_rows ≥ width + 2`` for every layer they regress on (an exact fit otherwise), and
    eigenspace_overlap for every layer (gulp at ridge 0 too, which its options decide: refused on the data); rsa
    takes at most 5,000 rows.

    Parameters
    ----------
    name : a key of :data:`MEASURES`.
    num_rows : the number of examples (rows) the layers will have.
    widths : the width of one layer, a sequence of widths, or a mapping ``{layer name: width}`` (the
        names then appear in the message). Pass every layer that may be a measure's second argument
        (for ``similarity_matrix(name, xs)`` all of ``xs``, for ``(xs, ys)`` at least ``ys``).

    Raises
    ------
    LayersimError
        One sentence naming the measure, ``n``, the offending ``d`` and what to change; or for an
        unknown measure name or sizes that are not positive integers.
    """
    measure = get_measure(name)
    if isinstance(widths, Mapping):
        named = [(str(key), value) for key, value in widths.items()]
    elif isinstance(widths, (int, np.integer)) and not isinstance(widths, bool):
        named = [("a layer", widths)]
    else:
        named = [("a layer", value) for value in widths]
    for label, value in [("num_rows", num_rows)] + [(f"the width of {key}", value) for key, value in named]:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise LayersimError(f"{label} must be a positive integer, got {value!r}.")
    if num_rows < measure.min_rows:
        raise LayersimError(
            f"{name} cannot be computed on n = {num_rows} examples: it needs at least {measure.min_rows}, so use "
            "more examples (e.g. a larger extract.max_examples, or None for all) or another measure."
        )
    if measure.check_sizes is not None:
        for key, width in named:
            measure.check_sizes(int(num_rows), int(width), key)


def check_computable_on(name: str, num_rows: int, width: int, **options) -> None:
    """:func:`check_computable` on these sizes, then the measure on one pair of random layers of that shape with its
    `options`: what only the data can tell (gulp without a ridge on a layer wider than the examples), in seconds
    at most, before a caller's expensive work."""
    check_computable(name, num_rows, width)
    rng = np.random.default_rng(0)
    similarity_matrix(name, [rng.normal(size=(num_rows, width)) for _ in range(2)], **options)


def similarity(name: str, x: np.ndarray, y: np.ndarray, **options) -> float:
    """One value of the measure called ``name`` between two ``(num_examples x hidden)`` arrays."""
    measure = get_measure(name)
    check_options(name, options, measure.options)
    return float(measure.pair(x, y, **options))


def similarity_matrix(
    name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, **options
) -> np.ndarray:
    """All-pairs matrix of the measure called ``name``: entry [i, j] = measure(xs[i], ys[j]).

    Parameters
    ----------
    name : a key of :data:`MEASURES`.
    xs : sequence of ``(num_examples x hidden_i)`` arrays (same examples, widths may differ).
    ys : the same, or None to compare ``xs`` with itself.
    **options : the measure's options (``Measure.options``), e.g. ``variance_threshold=0.95`` for
        svcca, ``method="gram"`` for linear_cka.

    Returns
    -------
    float64 array of shape ``(len(xs), len(ys))`` (``len(xs)`` squared for ys=None).

    Raises
    ------
    LayersimError
        For an unknown name or option (listing the valid ones) and the measure's own input errors.
    """
    measure = get_measure(name)
    check_options(name, options, measure.options)
    return measure.matrix(xs, ys, **options)
