"""Canonical correlation analysis (CCA) between layer representations: SVCCA, PWCCA, mean R²_CCA.

A representation is an array of shape ``(num_examples x hidden)``; rows are examples (the same on
both sides), widths may differ. With ``Xc``, ``Yc`` the column-centred data, CCA finds directions
``a``, ``b`` maximising ``corr(Xc a, Yc b)``; the successive maxima ``ρ_1 ≥ ρ_2 ≥ ...`` are the
canonical correlations, ``min(rank Xc, rank Yc)`` of them. They are computed without ever inverting
a covariance matrix:

1. **whiten** each side: an orthonormal basis ``Qx`` (n x rx) of the column space of ``Xc``, from
   its SVD ``Xc = U S Vᵀ`` (``Qx = U``) or from a column-pivoted QR ``Xc P = Q R`` (``Qx = Q``).
   Directions whose singular value (or pivoted ``|R_ii|``) is below ``rtol`` times the largest are
   dropped — a rank-deficient input (duplicated or linearly dependent neurons, more neurons than
   examples) loses those directions instead of producing a division by ~0;
2. the canonical correlations are the singular values of ``Qxᵀ Qy`` (rx x ry). Both bases are
   orthonormal, so these are cosines of principal angles: in [0, 1] up to rounding, and clipped to
   [0, 1]. The canonical variates of ``x`` are ``H = Qx U`` with ``Qxᵀ Qy = U diag(ρ) Vᵀ``.

The measures (Wu et al. 2020, Appendix A.3):

* ``svcca`` (Raghu et al. 2017): first reduce each side to its fewest top principal components
  explaining at least ``variance_threshold`` of the variance (``Qx = U[:, :k]``), then CCA; the
  mean canonical correlation. Symmetric.
* ``pwcca`` (Morcos et al. 2018): the mean of the canonical correlations weighted by how much of
  ``x`` each canonical variate accounts for, ``α_i ∝ Σ_j |h_iᵀ xc_j|`` over the (centred) neurons
  ``xc_j`` of ``x``, normalised to sum to 1. Asymmetric: **the weights come from the first
  argument** ``x``; ``pwcca(x, y) != pwcca(y, x)`` in general.
* ``mean_cca_r2``: the mean squared canonical correlation, ``R²_CCA = Σ ρ_i² / min(rx, ry)``.
  Symmetric.

CCA is invariant to any invertible linear map (and translation) of either side, so ``mean_cca_r2``
is too (when ``max_dims`` cuts no dimension: the cap keeps top principal components, which depend
on the variance spectrum); ``svcca`` only to maps that keep the variance spectrum (orthogonal maps, isotropic scaling),
because the principal-component cut depends on it; ``pwcca`` is invariant to invertible maps of
``y`` but not to rotations of ``x`` (its weights sum over x's neurons).

Bias, and the dimension cap ``max_dims``: with ``n`` examples, CCA between independent random ``p``-
and ``q``-dimensional data gives ``E[Σ ρ²] = p q / (n - 1)``, so ``mean_cca_r2 ≈ max(p, q) / (n - 1)``
and all correlations reach 1 once ``rx + ry ≥ n - 1``: on independent 277 x 768 Gaussian data the
uncapped measures give svcca 0.96, pwcca 1.00, mean_cca 1.00. So by default (``max_dims="auto"``)
``svcca``, ``pwcca`` and ``mean_cca_r2`` keep, after the rank cut (and svcca's/pwcca's variance cut),
at most

    k_max = max(1, ⌊(n - 1) / 10⌋)

top principal components of each side (:data:`ROWS_PER_DIMENSION` = 10 centred examples per kept
dimension; :func:`dimension_cap`). Why 10: with ``k`` dimensions per side the null mean squared
correlation is ``E[mean_cca_r2] = k / (n - 1) ≤ 0.1``, and the largest null squared correlation
tends to the upper edge of Wachter's (1980, Ann. Statist. 8, 937–957) limiting spectrum,
``4 γ (1 - γ)`` with ``γ = k / n ≤ 0.1``, i.e. ``ρ_1 ≲ 0.6``; measured on independent Gaussian
data the capped svcca/pwcca are about 0.27 and mean_cca about 0.10 at every ``n``. It is also the
usual rule of thumb of at least 10 observations per variable for CCA (Barcikowski & Stevens 1975,
Multivariate Behav. Res. 10, 353–364, found that stable canonical *weights and loadings* need
considerably more; the similarity measures only use the correlations). A larger cap raises the
floor of unrelated layers towards 1; a smaller one discards directions real layers share. The cap
only reduces dimensions, so representations with fewer than ``k_max`` directions (e.g. 64-wide
layers with 2,000 examples) are compared exactly as before. ``max_dims`` may also be a positive
integer (a fixed cap) or None (no cap: the uncapped, possibly degenerate CCA). Use
:func:`kept_dimensions` to record how many dimensions a layer actually kept.

Differences from public code (Google's ``svcca`` repository, Wu et al.'s ``contextual-corr-analysis``):
the data are only centred, never divided by neuron standard deviations (Wu's code standardises
neurons before the SVD by default); the SVCCA cut keeps the *fewest components reaching* the
threshold (at least one), where Wu's code keeps those *strictly below* it (one fewer); the PWCCA
weights use the centred activations of ``x`` and always weight ``x`` (Google's ``compute_pwcca``
uses raw activations and weights whichever side has fewer neurons); PWCCA runs on the full-rank CCA
unless ``variance_threshold`` is given (Wu's ``pwsim`` is ``variance_threshold=0.99``); none of
them caps the number of dimensions as ``max_dims="auto"`` does here (``max_dims=None`` restores
their behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.errors import LayersimError
from layersim.similarity._common import (
    Named,
    check_rtol,
    named_lists,
    validated,
)
from layersim.similarity._pairs import fill_matrix

from layersim.similarity._cca_core import (  # noqa: F401  (re-exported: one import path for callers)
    METHODS, ROWS_PER_DIMENSION, CAPPED_MEASURES, Basis, bases_reused, whiten, _principal_directions, _correlations, _pw_both, _pw_weighted, dimension_cap, check_max_dims, kept_dimensions, _check_method, _check_threshold)


def _bases(named: Named, measure: str, **kwargs) -> list[Basis]:
    return [whiten(name, a, measure, **kwargs) for name, a in named]


def _prepare(x_named: Named, y_named: Named | None, measure: str) -> tuple[Named, Named | None]:
    checked = validated(x_named + (y_named or []), measure)
    return checked[: len(x_named)], (None if y_named is None else checked[len(x_named) :])


# --- pair functions ---


def canonical_correlations(
    x: np.ndarray,
    y: np.ndarray,
    *,
    method: str = "svd",
    variance_threshold: float | None = None,
    rtol: float | None = None,
    max_dims: int | str | None = None,
) -> np.ndarray:
    """Canonical correlations between (n, d1) and (n, d2) arrays, descending, in [0, 1].

    Parameters
    ----------
    x, y : arrays of shape ``(num_examples x hidden)``, rows aligned; any real dtype (float64 inside).
    method : ``"svd"`` (whiten by SVD) or ``"qr"`` (by column-pivoted QR); both exact, they agree to
        rounding.
    variance_threshold : None for plain CCA, or a number in (0, 1]: first keep each side's fewest top
        principal components explaining at least that share of variance (the SVCCA step; SVD only).
    rtol : relative singular-value (pivot) tolerance for rank deficiency; None means
        ``max(n, d) · eps``.
    max_dims : None (the default here: exact CCA of the whole column spaces), "auto" or a positive
        int: keep at most that many top principal components per side (see the module docstring;
        the similarity measures default to "auto").

    Returns
    -------
    float64 array of ``min(rx, ry)`` correlations, ``rx``, ``ry`` the retained ranks.

    Raises
    ------
    LayersimError
        For bad shapes, fewer than 2 rows, NaN/inf, a constant input, an unknown ``method``, or a
        bad ``variance_threshold``/``rtol``/``max_dims``.
    """
    _check_method(method, variance_threshold)
    _check_threshold(variance_threshold)
    check_rtol(rtol)
    check_max_dims(max_dims)
    (xn, yn) = _prepare([("x", x)], [("y", y)], "CCA")
    kwargs = dict(method=method, variance_threshold=variance_threshold, rtol=rtol, max_dims=max_dims)
    return _correlations(whiten(*xn[0], "CCA", **kwargs), whiten(*yn[0], "CCA", **kwargs))


def svcca(
    x: np.ndarray,
    y: np.ndarray,
    variance_threshold: float = 0.99,
    *,
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> float:
    """SVCCA (Raghu et al. 2017; Wu et al.'s svsim): mean canonical correlation after reducing each
    side to its top principal components.

    Parameters
    ----------
    x, y : arrays of shape ``(num_examples x hidden)``, rows aligned, widths may differ.
    variance_threshold : per side, keep the fewest top principal components (of the centred data)
        whose variance reaches this share of the total, in (0, 1]; 1.0 keeps every non-null one.
    rtol : see :func:`canonical_correlations`.
    max_dims : "auto" (default: at most ``max(1, ⌊(n - 1) / 10⌋)`` components per side, see the
        module docstring), a positive int (at most that many), or None (no cap beyond the threshold).

    Returns
    -------
    The mean of the ``min(kx, ky)`` canonical correlations, in [0, 1]; symmetric; invariant to
    orthogonal maps, isotropic scaling and translation of either side; 1 for ``svcca(x, x)``.

    Raises
    ------
    LayersimError
        As :func:`canonical_correlations`.
    """
    return float(_svcca([("x", x)], [("y", y)], variance_threshold, rtol, max_dims=max_dims)[0, 0])


def pwcca(
    x: np.ndarray,
    y: np.ndarray,
    *,
    method: str = "svd",
    variance_threshold: float | None = None,
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> float:
    """Projection-weighted CCA (Morcos et al. 2018; Wu et al.'s pwsim), weighted by ``x``.

    Parameters
    ----------
    x : ``(num_examples x hidden_x)``, the side whose neurons weight the canonical correlations.
    y : ``(num_examples x hidden_y)``, rows aligned with ``x``.
    method, variance_threshold, rtol : as for :func:`canonical_correlations`; Wu et al.'s pwsim is
        ``variance_threshold=0.99`` (CCA on the SVCCA-reduced data), the default is Morcos et al.'s
        plain CCA.
    max_dims : as for :func:`svcca` (default "auto"); the weights are then those of the kept
        components' canonical variates.

    Returns
    -------
    ``Σ_i α_i ρ_i`` with ``α_i = Σ_j |h_iᵀ xc_j| / Σ_k Σ_j |h_kᵀ xc_j|``, ``h_i`` the unit-norm
    canonical variates of ``x`` and ``xc_j`` its centred neurons; in [0, 1]; asymmetric.

    Raises
    ------
    LayersimError
        As :func:`canonical_correlations`.
    """
    return float(_pwcca([("x", x)], [("y", y)], method, variance_threshold, rtol, max_dims=max_dims)[0, 0])


def mean_cca_r2(
    x: np.ndarray,
    y: np.ndarray,
    *,
    method: str = "svd",
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> float:
    """Mean squared canonical correlation ``R²_CCA = Σ ρ_i² / min(rx, ry)``, in [0, 1], symmetric.

    Invariant to any invertible linear map and translation of either side when no dimension is cut
    by ``max_dims`` (default "auto", as for :func:`svcca`; None: no cap). See
    :func:`canonical_correlations` for the other parameters and the errors.
    """
    return float(_mean_cca([("x", x)], [("y", y)], method, rtol, max_dims=max_dims)[0, 0])


# --- matrix functions (per-layer bases computed once) ---


def svcca_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    variance_threshold: float = 0.99,
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> np.ndarray:
    """All-pairs SVCCA: [i, j] = ``svcca(xs[i], ys[j])``; ys=None compares xs with itself (upper
    triangle computed and mirrored, diagonal exactly 1). One SVD per layer; a pair then costs one
    small ``kx x ky`` SVD."""
    return _svcca(*named_lists(xs, ys), variance_threshold, rtol, max_dims=max_dims)


def _svcca(
    x_named: Named,
    y_named: Named | None,
    variance_threshold: float,
    rtol: float | None,
    *,
    max_dims: int | str | None = "auto",
) -> np.ndarray:
    if variance_threshold is None:
        raise LayersimError("svcca needs a variance_threshold in (0, 1]; use mean_cca or pwcca for plain CCA.")
    _check_threshold(variance_threshold)
    check_rtol(rtol)
    check_max_dims(max_dims)
    x_named, y_named = _prepare(x_named, y_named, "SVCCA")
    kwargs = dict(method="svd", variance_threshold=variance_threshold, rtol=rtol, max_dims=max_dims)
    bx = _bases(x_named, "SVCCA", **kwargs)
    by = None if y_named is None else _bases(y_named, "SVCCA", **kwargs)
    return fill_matrix(bx, by, lambda a, b: float(_correlations(a, b).mean()), symmetric=True)


def pwcca_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    method: str = "svd",
    variance_threshold: float | None = None,
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> np.ndarray:
    """All-pairs PWCCA: [i, j] = ``pwcca(xs[i], ys[j])`` (weighted by ``xs[i]``). ys=None computes
    both directions of each pair from one SVD; diagonal exactly 1."""
    return _pwcca(*named_lists(xs, ys), method, variance_threshold, rtol, max_dims=max_dims)


def _pwcca(
    x_named: Named,
    y_named: Named | None,
    method: str,
    variance_threshold: float | None,
    rtol: float | None,
    *,
    max_dims: int | str | None = "auto",
) -> np.ndarray:
    _check_method(method, variance_threshold)
    _check_threshold(variance_threshold)
    check_rtol(rtol)
    check_max_dims(max_dims)
    x_named, y_named = _prepare(x_named, y_named, "PWCCA")
    kwargs = dict(method=method, variance_threshold=variance_threshold, rtol=rtol, max_dims=max_dims)
    bx = _bases(x_named, "PWCCA", keep_coords=True, **kwargs)
    by = None if y_named is None else _bases(y_named, "PWCCA", keep_coords=True, **kwargs)
    return fill_matrix(bx, by, lambda a, b: _pw_both(a, b)[0], symmetric=False, pair_both=_pw_both)


def mean_cca_matrix(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray] | None = None,
    *,
    method: str = "svd",
    rtol: float | None = None,
    max_dims: int | str | None = "auto",
) -> np.ndarray:
    """All-pairs mean R²_CCA: [i, j] = ``mean_cca_r2(xs[i], ys[j])``; symmetric; diagonal exactly 1."""
    return _mean_cca(*named_lists(xs, ys), method, rtol, max_dims=max_dims)


def _mean_cca(
    x_named: Named, y_named: Named | None, method: str, rtol: float | None, *, max_dims: int | str | None = "auto"
) -> np.ndarray:
    _check_method(method, None)
    check_rtol(rtol)
    check_max_dims(max_dims)
    x_named, y_named = _prepare(x_named, y_named, "CCA")
    kwargs = dict(method=method, rtol=rtol, max_dims=max_dims)
    bx = _bases(x_named, "CCA", **kwargs)
    by = None if y_named is None else _bases(y_named, "CCA", **kwargs)
    return fill_matrix(bx, by, lambda a, b: float(np.mean(_correlations(a, b) ** 2)), symmetric=True)
