"""Permutation nulls for every similarity measure: what value does chance alone give?

Similarity values are biased upwards when the number of examples is not much larger than the
widths: on independent Gaussian data at n = 277, d = 768 linear CKA gives ~0.73 and PWCCA 1.00.
A value only means something next to its **null distribution**: the values the measure takes when
the pairing of examples between the two representations is destroyed. Here the null is the
permutation null of Mantel / RV tests (Josse, Pagès & Husson 2008): the rows of ``y`` are shuffled
(``y[π]``, ``π`` a uniformly random permutation) while ``x`` stays fixed, which keeps each
representation's own structure (widths, spectrum, neuron distributions) and breaks only the
correspondence between examples. Reported per comparison: the observed value, the null mean (the
measure's bias at this n and these widths), the null's 95th percentile, a one-sided p-value
``P(null >= observed)`` and the chance-adjusted value ``(observed - null_mean) / (1 - null_mean)``
(0 = chance level, 1 = the maximum).

Sampling: ``rng = np.random.default_rng(seed)``, then ``rng.permutation(n)`` once per permutation in
order, the same for every cell, so ``permutation_matrix(...)`` cell [i, j] equals
``permutation_test(name, xs[i], ys[j])`` with the same seed. p-value ``(1 + #{null >= observed}) /
(1 + permutations)`` (Phipson & Smyth 2010: never 0). Each layer's statistics are computed once and
a permutation only row-permutes the y-side statistics (see :mod:`layersim.similarity.inference._null_engines`).

Rows of one example (the words of a sentence, the choices of a question) are not exchangeable: with
``groups`` (each row's example) and ``strata``, a draw permutes whole examples among examples of the same
stratum and size instead (:mod:`layersim.similarity.inference.exchangeability`, method "block permutation"); with one row
per example and one stratum it is the row permutation above, the same draws for a seed.

Exact linear CKA: linear CKA is the RV coefficient of the centred data, whose permutation
distribution has exact moments computable from per-layer traces (Kazi-Aoual et al. 1995, "Refined
approximations to permutation tests for multivariate inference", Comput. Stat. Data Anal.; Josse,
Pagès & Husson 2008, "Testing the significance of the RV coefficient"; FactoMineR's ``coeffRV``):
see :mod:`layersim.similarity.inference._rv`. With ``exact=None`` linear_cka uses them (no permutations) while rows are
exchangeable (sampled block permutations otherwise: the moments are those of the row permutation): a Pearson type III
with the exact mean, variance and skewness (false-positive rate at α = 0.01 on t(3) data 0.009–0.013 over
4,000 draws where the former gamma-shaped skew gave 0.021–0.035). The mean and variance come from traces, sums
over rows, so :func:`streamed_linear_cka_null` gives them from one streamed pass
(:class:`~layersim.similarity.LinearCKAAccumulator`) for tables larger than memory; its skewness comes from the
accumulator's row sample (exact while the table fits the sample, else an estimate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import LayersimError, unknown_name
import layersim.similarity._cka_kernels as _cka_kernels
import layersim.similarity.inference._rv as _rv
import layersim.similarity.cka as cka
from layersim.similarity._common import check_options, named_lists, validated
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.inference.exchangeability import block_permutations
from layersim.similarity.registry import get_measure


def chance_adjusted(observed, null_mean):
    """``(observed - null_mean) / (1 - null_mean)``, elementwise: 0 at chance level, 1 at the maximum.

    Works on floats and arrays (NaN propagates); for a null mean of 1 the result is NaN or ±inf.
    """
    observed = np.asarray(observed, dtype=np.float64)
    null_mean = np.asarray(null_mean, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (observed - null_mean) / (1.0 - null_mean)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class NullResult:
    """The permutation null of one comparison ``measure(x, y)`` (see the module docstring)."""

    observed: float
    null_mean: float
    null_p95: float  # 95th percentile of the null distribution
    p_value: float  # one-sided, P(null >= observed)
    permutations: int  # number of sampled permutations; 0 when exact moments were used
    method: str  # "exact" (linear CKA moments), "permutation" (rows) or "block permutation" (whole examples)

    @property
    def adjusted(self) -> float:
        """The chance-adjusted value ``(observed - null_mean) / (1 - null_mean)``."""
        return chance_adjusted(self.observed, self.null_mean)


@dataclass(frozen=True)
class NullMatrix:
    """The nulls of all comparisons ``measure(xs[i], ys[j])``: arrays of shape ``(len(xs), len(ys))``,
    NaN where a cell was not computed (outside ``cells``)."""

    observed: np.ndarray
    null_mean: np.ndarray
    null_p95: np.ndarray
    p_value: np.ndarray
    permutations: int
    method: str

    def adjusted(self) -> np.ndarray:
        """The chance-adjusted values ``(observed - null_mean) / (1 - null_mean)``, elementwise."""
        return chance_adjusted(self.observed, self.null_mean)

    def __getitem__(self, index: tuple[int, int]) -> NullResult:
        """Cell [i, j] as a :class:`NullResult`."""
        return NullResult(float(self.observed[index]), float(self.null_mean[index]), float(self.null_p95[index]),
                          float(self.p_value[index]), self.permutations, self.method)


def permutation_test(name: str, x: np.ndarray, y: np.ndarray, *, permutations: int = 1000, seed: int = 0,
                     exact: bool | None = None, groups: np.ndarray | None = None, strata: np.ndarray | None = None,
                     **options) -> NullResult:
    """The permutation null of ``measure(x, y[π])`` for one pair of ``(num_examples x hidden)`` arrays.

    Parameters
    ----------
    name : a key of :data:`layersim.similarity.MEASURES`.
    x, y : rows aligned; the rows of ``y`` are shuffled, ``x`` stays fixed.
    permutations : number of sampled permutations (>= 1), drawn as described in the module docstring.
    seed : seed of ``np.random.default_rng``.
    exact : None = exact moments where available (linear_cka, rows exchangeable), permutations otherwise;
        False = always permutations; True = exact moments (linear_cka without blocks only, else an error).
    groups, strata : the example (and stratum) of each row, or None: whole examples are permuted among
        examples of the same stratum and size (:mod:`layersim.similarity.inference.exchangeability`); with one row per
        example and one stratum, the same row permutations (and exact moments) as without.
    **options : the measure's own options, as for :func:`layersim.similarity.similarity`.

    Returns
    -------
    :class:`NullResult`; ``permutation_matrix(name, [x], [y], ...)[0, 0]`` exactly.

    Raises
    ------
    LayersimError
        For an unknown measure or option, ``permutations < 1``, ``exact=True`` for a measure other
        than linear_cka, and the measure's own input errors (constant layers included).
    """
    return _null(name, [("x", x)], [("y", y)], None, permutations, seed, exact, options, groups, strata)[0, 0]


def permutation_matrix(name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *,
                       permutations: int = 100, seed: int = 0, exact: bool | None = None,
                       cells: np.ndarray | None = None, groups: np.ndarray | None = None,
                       strata: np.ndarray | None = None, **options) -> NullMatrix:
    """Permutation nulls of all comparisons: cell [i, j] is the null of ``measure(xs[i], ys[j][π])``.

    Each layer's statistics are computed once; a permutation row-permutes the y-side statistics and
    redoes only the per-pair work, so a null costs about ``permutations`` times the per-pair part of
    :func:`layersim.similarity.similarity_matrix` (and next to nothing for exact linear_cka).

    Parameters
    ----------
    name, permutations, seed, exact, groups, strata, **options : as for :func:`permutation_test`; the same seed gives
        the same permutations for every cell, so cell [i, j] equals ``permutation_test(name, xs[i],
        ys[j])`` with that seed (to float rounding).
    xs, ys : sequences of ``(num_examples x hidden_i)`` arrays; ``ys=None`` takes ``ys = xs`` (cell
        [i, j] is then ``measure(xs[i], xs[j][π])``; the matrix is not symmetric in general and the
        diagonal is the null of a layer against its own shuffled copy).
    cells : None for every cell, or a boolean array of shape ``(len(xs), len(ys))``: only those cells
        are computed (the others are NaN) and only the layers they use are prepared.

    Returns
    -------
    :class:`NullMatrix` with ``method`` "exact", "permutation" or "block permutation" (whole examples).
    """
    return _null(name, *named_lists(xs, ys), cells, permutations, seed, exact, options, groups, strata)


def streamed_linear_cka_null(accumulator, cells: np.ndarray | None = None) -> NullMatrix:
    """The permutation null of every cell of a :class:`LinearCKAAccumulator`'s matrix (all layers against
    all), from what it gathered in its one pass over row batches, for tables larger than memory: the exact
    mean and variance (traces are sums over rows); the skewness from its row sample (exact while the table
    had at most ``sample_rows`` rows, then estimated: its sums over rows and pairs of rows scaled up,
    :func:`_rv.sampled_cubic_invariants`; the gamma's ``2 sd / mean`` with ``sample_rows=0``). Equal to
    ``permutation_matrix("linear_cka", layers, exact=True)`` on the concatenated rows (to rounding) while
    the sample holds every row. Constant layers and cells outside ``cells`` are NaN."""
    observed = accumulator.matrix(constant="nan")
    hsic = np.diag(accumulator.hsic())
    trace, products = accumulator.row_norm_products()
    diag_sq = np.diag(products)
    defined = np.isfinite(np.diag(observed))
    shape = observed.shape
    out = [observed.copy()] + [np.full(shape, np.nan) for _ in range(3)]
    idx = np.flatnonzero(defined)
    if idx.size:
        n = accumulator.num_rows
        t, t2, s2 = trace[idx], hsic[idx], diag_sq[idx]
        mean, var = _rv.moments(n, t[:, None], t2[:, None], s2[:, None], t[None, :], t2[None, :], s2[None, :])
        sub = observed[np.ix_(idx, idx)]
        skew = None
        if accumulator.sample_rows:
            inv = np.array([_rv.sampled_cubic_invariants(accumulator.sample(k), accumulator.layer_mean(k), n,
                                                         trace[k], accumulator.centred_block(k, k)) for k in idx])
            skew = _rv.skewness(n, inv, inv, var)
        p95, p_value = _rv.pearson3_null(sub, mean, var, skew)
        for target, values in zip(out[1:], (mean, p95, p_value)):
            target[np.ix_(idx, idx)] = values
    chosen = _check_cells(cells, shape)
    for a in out:
        a[~chosen] = np.nan
    return NullMatrix(*out, 0, "exact")


def _null(name: str, x_named, y_named, cells, permutations, seed, exact, options, groups=None,
          strata=None) -> NullMatrix:
    measure = get_measure(name)
    check_options(name, options, measure.options)
    if measure.no_null:
        raise LayersimError(f"{name} has {measure.no_null}.")
    if exact is not None and not isinstance(exact, bool):
        raise LayersimError(f"exact must be True, False or None, got {exact!r}.")
    if exact and name != "linear_cka":
        raise LayersimError(
            f"exact=True is available only for linear_cka (the RV coefficient's moments), not {name!r}; "
            "use exact=None or exact=False for sampled permutations."
        )
    if isinstance(permutations, bool) or not isinstance(permutations, (int, np.integer)) or permutations < 1:
        raise LayersimError(f"permutations must be an integer >= 1, got {permutations!r}.")
    shape = (len(x_named), len(x_named if y_named is None else y_named))
    cells = _check_cells(cells, shape)
    num_rows = np.asarray(x_named[0][1]).shape[0] if np.ndim(x_named[0][1]) == 2 else 0
    blocks = block_permutations(num_rows, groups, strata)
    blocks.check()
    if exact and not blocks.plain:
        raise LayersimError("exact=True needs exchangeable rows (one row per example, one stratum): linear CKA's "
                            "exact moments are those of the row permutation; use exact=None for block permutations.")
    # Below 4 examples the moments are undefined: exact=None falls back to sampling, exact=True raises.
    use_exact = name == "linear_cka" and (exact is True or (exact is None and num_rows >= 4 and blocks.plain))
    if use_exact:
        return _exact_linear_cka(x_named, y_named, cells, **options)
    return drawn_null(ENGINES[name](x_named, y_named, cells, **options), blocks, cells, int(permutations), seed)


def drawn_null(engine, blocks, cells: np.ndarray, permutations: int, seed: int) -> NullMatrix:
    """The null of an engine's cells (``engine.values(perm)``: the measure with the y side's rows permuted by
    ``perm``) over `permutations` draws of `blocks` (a :class:`~layersim.similarity.inference.exchangeability.
    BlockPermutations`) from ``np.random.default_rng(seed)``, in order and batched as the engine allows."""
    observed = engine.values(None)
    method = "permutation" if blocks.plain else "block permutation"
    if not cells.any():
        nan = np.full(cells.shape, np.nan)
        return NullMatrix(observed, nan, nan.copy(), nan.copy(), permutations, method)
    from layersim.compute.device import analysis_batch  # torch: only once a null is drawn

    rng = np.random.default_rng(seed)
    null = np.empty((permutations, int(cells.sum())))
    batch = analysis_batch(engine.bytes_per_permutation(), permutations)
    for start in range(0, permutations, batch):  # the draws in order, so every batch size gives the same null
        perms = np.stack([blocks.draw(rng) for _ in range(min(batch, permutations - start))])
        null[start : start + len(perms)] = engine.values_batch(perms)[:, cells]
    return dataclasses.replace(_summary(observed, null, cells, permutations), method=method)


def _check_cells(cells, shape: tuple[int, int]) -> np.ndarray:
    if cells is None:
        return np.ones(shape, dtype=bool)
    mask = np.asarray(cells)
    if mask.dtype != np.bool_ or mask.shape != shape:
        raise LayersimError(
            f"cells must be a boolean array of shape {shape} (len(xs), len(ys)), got "
            f"{mask.dtype} array of shape {mask.shape}."
        )
    return mask


_TIE_RTOL = 1e-9


def _summary(observed: np.ndarray, null: np.ndarray, cells: np.ndarray, permutations: int) -> NullMatrix:
    """Mean, 95th percentile and p-value per cell from the sampled ``(permutations, cells)`` values."""
    mean, p95, p_value = (np.full(cells.shape, np.nan) for _ in range(3))
    obs = observed[cells]
    mean[cells] = null.mean(axis=0)
    p95[cells] = np.percentile(null, 95, axis=0)
    # A permuted value equal to the observed one up to float rounding is a tie and counts as >= (a
    # point-mass null must give p = 1, not 0.5 by the luck of the last bit).
    ties = _TIE_RTOL * np.maximum(1.0, np.abs(obs))
    p_value[cells] = (1.0 + np.count_nonzero(null >= (obs - ties)[None, :], axis=0)) / (1.0 + permutations)
    return NullMatrix(observed, mean, p95, p_value, permutations, "permutation")


def _used_invariants(named, used: np.ndarray) -> np.ndarray:
    """:func:`_rv.cubic_invariants` of the `used` layers, NaN rows for the others."""
    out = np.full((len(named), 5), np.nan)
    if used.any():
        out[used] = _rv.cubic_invariants([item for item, keep in zip(named, used) if keep])
    return out


def _exact_linear_cka(x_named, y_named, cells: np.ndarray, *, method: str = "auto") -> NullMatrix:
    """Observed linear CKA through :func:`cka_matrix`'s machinery, whose self-HSICs are the ``tr K²``
    the RV moments need; the mean and variance need one ``O(n d)`` pass per layer, the skewness ``n² d``
    (:mod:`layersim.similarity.inference._rv`)."""
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    symmetric = y_named is None
    checked = validated(x_named + (y_named or []), "CKA")
    x_named, y_named = checked[: len(x_named)], (None if symmetric else checked[len(x_named):])
    n = x_named[0][1].shape[0]
    widths_x = [a.shape[1] for _, a in x_named]
    widths_y = None if symmetric else [a.shape[1] for _, a in y_named]
    if method == "auto":
        method = cka._pick_method(n, widths_x, widths_y)
    gram_cost, feature_cost, _ = cka._costs(n, widths_x, widths_y)
    dtype = cka._product_dtype("auto", [a for _, a in checked], gram_cost if method == "gram" else feature_cost)
    hsic_fn = cka._hsic_gram if method == "gram" else cka._hsic_feature
    hsic, self_x, self_y = hsic_fn(x_named, y_named, dtype=dtype)
    observed = _cka_kernels._normalise(hsic, self_x, self_y, symmetric)
    trace_x, diag_x = _rv.row_traces(x_named)
    trace_y, diag_y = (trace_x, diag_x) if symmetric else _rv.row_traces(y_named)
    mean, var = _rv.moments(n, trace_x[:, None], self_x[:, None], diag_x[:, None],
                            trace_y[None, :], self_y[None, :], diag_y[None, :])
    # The skewness needs each layer's n x n Gram (n² d): only for the layers a requested cell uses.
    inv_x = _used_invariants(x_named, cells.any(axis=1))
    inv_y = inv_x if symmetric and (cells.any(axis=0) == cells.any(axis=1)).all() else _used_invariants(
        x_named if symmetric else y_named, cells.any(axis=0))
    p95, p_value = _rv.pearson3_null(observed, mean, var, _rv.skewness(n, inv_x, inv_y, var))
    out = [observed, mean, p95, p_value]
    for a in out:
        a[~cells] = np.nan
    return NullMatrix(*out, 0, "exact")
