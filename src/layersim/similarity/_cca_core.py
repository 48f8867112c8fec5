"""The CCA core shared by SVCCA, PWCCA and mean CCA (:mod:`layersim.similarity.cca`): each layer whitened once
into an orthonormal basis of its centred data (or of its top principal directions), canonical
correlations between two bases, PWCCA's projection weights, and the rule that caps the dimensions
(``max_dims="auto"``: one per ``ROWS_PER_DIMENSION`` examples)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from layersim.errors import LayersimError, unknown_name
from layersim.compute.linalg import (canonical_correlations_of, canonical_pairs, default_rtol, numerical_rank,
                                     variance_rank)
from layersim.similarity._common import centre_drop_constant, check_rtol, validated

METHODS = ("svd", "qr")

# The default cap keeps at most one dimension per this many centred examples (see the module docstring).
ROWS_PER_DIMENSION = 10

# Measures whose dimensions max_dims caps, by registry name, with their label in error messages.
CAPPED_MEASURES = {"svcca": "SVCCA", "pwcca": "PWCCA", "mean_cca": "CCA"}


@dataclass(frozen=True)
class Basis:
    """One layer's whitened form: an orthonormal basis of its centred data (or of its top principal
    components), and optionally the coordinates of its neurons in that basis (for PWCCA weights)."""

    name: str
    q: np.ndarray  # (n, r), orthonormal columns
    coords: np.ndarray | None  # (r, d) = qᵀ Xc, or None when not needed


# --- whitening ---

# Inside bases_reused(): each array's bases already computed, by (id of the array, options), with a weak reference
# that tells a live array from a later one at the same address and drops the entry when the array goes.
_REUSED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("reused_bases", default=None)


@contextlib.contextmanager
def bases_reused() -> Iterator[None]:
    """Inside this context :func:`whiten` computes each array's basis once per set of options: one layer's observed
    matrix, null, kept dimensions and bootstrap estimates share one SVD (the same numbers, bit for bit). The caller
    promises not to change an array in place while inside. Nested, the outer context's bases are kept."""
    if _REUSED.get() is not None:
        yield
        return
    token = _REUSED.set({})
    try:
        yield
    finally:
        _REUSED.reset(token)


def whiten(
    name: str,
    a: np.ndarray,
    measure: str,
    *,
    method: str = "svd",
    variance_threshold: float | None = None,
    rtol: float | None = None,
    keep_coords: bool = False,
    max_dims: int | str | None = None,
) -> Basis:
    """Orthonormal basis of the centred ``a`` (constant neurons ignored), rank-truncated at ``rtol``
    and, with ``variance_threshold``, cut to the fewest top principal components reaching it; then,
    with ``max_dims`` (an int, or "auto" for :func:`dimension_cap` of ``a``'s row count; None: no
    cap, the default here), cut to at most that many top principal components. Inside :func:`bases_reused`, an
    array whitened before with the same options gets the same basis again."""
    reused = _REUSED.get()
    if reused is None:
        return _whiten(name, a, measure, method, variance_threshold, rtol, keep_coords, max_dims)
    key = (id(a), method, variance_threshold, rtol, dimension_cap(len(a), max_dims))
    known = reused.get(key)
    if known is not None and known[0]() is a and (known[1].coords is not None or not keep_coords):
        return dataclasses.replace(known[1], name=name, coords=known[1].coords if keep_coords else None)
    basis = _whiten(name, a, measure, method, variance_threshold, rtol, keep_coords, max_dims)
    try:
        reused[key] = (weakref.ref(a, lambda _, key=key: reused.pop(key, None)), basis)
    except TypeError:  # an object without weak references (a list, say): not kept
        pass
    return basis


def _whiten(name: str, a: np.ndarray, measure: str, method: str, variance_threshold: float | None, rtol: float | None,
            keep_coords: bool, max_dims: int | str | None) -> Basis:
    centred, _ = centre_drop_constant(name, a, measure)
    n, d = centred.shape
    tol = default_rtol(n, d) if rtol is None else rtol
    cap = dimension_cap(n, max_dims)
    if method == "qr":
        # Column-pivoted QR: |R_00| >= |R_11| >= ..., and a direction whose pivot is below tol·|R_00|
        # is (numerically) spanned by the earlier columns.
        q, r, _ = scipy.linalg.qr(centred, mode="economic", pivoting=True, check_finite=False)
        rank = numerical_rank(np.abs(np.diag(r)), tol)
        basis = q[:, :rank]
        if cap is not None and cap < rank:
            # Top principal components: centred P = Q R, so the left singular vectors of centred are
            # Q times those of the small (rank x d) R (the column permutation does not change them).
            u_r = np.linalg.svd(r[:rank], full_matrices=False)[0]
            basis = basis @ u_r[:, :cap]
    else:
        u, s = _principal_directions(centred)
        rank = numerical_rank(s, tol)
        if variance_threshold is not None:
            rank = variance_rank(s[:rank], variance_threshold)
        if cap is not None:
            rank = min(rank, cap)
        basis = u[:, :rank]
    basis = np.ascontiguousarray(basis)
    return Basis(name, basis, basis.T @ centred if keep_coords else None)


def _principal_directions(centred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left singular vectors and singular values (descending) of a centred (n, d) array."""
    n, d = centred.shape
    if n >= 2 * d:
        # Tall: QR first, then the SVD of the small d x d factor (cheaper than a direct SVD).
        q, r = np.linalg.qr(centred)
        u_r, s, _ = np.linalg.svd(r)
        return q @ u_r, s
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    return u, s


def _correlations(bx: Basis, by: Basis) -> np.ndarray:
    """Canonical correlations (descending, clipped to [0, 1]) of two whitened layers."""
    return canonical_correlations_of(bx.q, by.q)


def _pw_both(bx: Basis, by: Basis) -> tuple[float, float]:
    """PWCCA weighted by x's neurons and by y's neurons, from one SVD of ``Qxᵀ Qy``."""
    u, rho, vt = canonical_pairs(bx.q, by.q)
    return _pw_weighted(u.T @ bx.coords, rho), _pw_weighted(vt @ by.coords, rho)


def projection_alphas(variates_dot_neurons: np.ndarray) -> np.ndarray:
    """PWCCA's unnormalised weights ``α_i = Σ_j |h_iᵀ xc_j|`` (Morcos et al. 2018; Ren et al. 2023 eq. 8), one per
    row of the argument, whose rows are ``h_iᵀ Xc``: unit-norm canonical variates against the centred neurons.
    Shared by the pwcca measure and the pwcca alignment map (layersim.align)."""
    return np.abs(variates_dot_neurons).sum(axis=1)


def _pw_weighted(variates_dot_neurons: np.ndarray, rho: np.ndarray) -> float:
    """Σ α_i ρ_i with α_i ∝ Σ_j |h_iᵀ xc_j| (rows of the argument are h_iᵀ Xc)."""
    alpha = projection_alphas(variates_dot_neurons)
    # Every h_i is a unit vector inside the column space of Xc, so some xc_j has h_iᵀ xc_j != 0:
    # the weights never sum to zero.
    return float(np.clip(alpha @ rho / alpha.sum(), 0.0, 1.0))


# --- the dimension cap ---


def dimension_cap(num_rows: int, max_dims: int | str | None = "auto") -> int | None:
    """The most principal components per side that the CCA measures keep for ``num_rows`` examples.

    ``max_dims="auto"``: ``max(1, ⌊(num_rows - 1) / 10⌋)`` (see the module docstring); a positive
    int: that number; None: no cap (returns None). Raises a LayersimError for any other value.
    """
    check_max_dims(max_dims)
    if max_dims is None:
        return None
    if max_dims == "auto":
        return max(1, (int(num_rows) - 1) // ROWS_PER_DIMENSION)
    return int(max_dims)


def check_max_dims(max_dims: object) -> None:
    """Raise a LayersimError unless ``max_dims`` is "auto", None or a positive integer."""
    if max_dims is None or (isinstance(max_dims, str) and max_dims == "auto"):
        return
    if isinstance(max_dims, (int, np.integer)) and not isinstance(max_dims, (bool, np.bool_)) and max_dims >= 1:
        return
    raise LayersimError(
        f"max_dims must be 'auto' (at most one dimension per {ROWS_PER_DIMENSION} examples), None (no cap) "
        f"or a positive integer, got {max_dims!r}."
    )


def kept_dimensions(x: np.ndarray, measure: str, **options) -> int:
    """How many dimensions of the layer ``x`` (``num_examples x hidden``) the CCA measure ``measure``
    ("svcca", "pwcca" or "mean_cca") compares, with the measure's ``options`` (the same keywords the
    measure takes, defaults included): its numerical rank, cut by the variance threshold (svcca; pwcca
    when given) and by ``max_dims``. The number is per layer, so record it per layer; a pair compares
    ``min(kept(x), kept(y))`` canonical correlations. Costs one SVD (or QR) of ``x``.

    Raises
    ------
    LayersimError
        For another measure name, an option the measure does not take, a bad option value, or a bad ``x``.
    """
    if measure not in CAPPED_MEASURES:
        raise unknown_name("CCA measure", measure, CAPPED_MEASURES, "kept_dimensions only applies to these")
    defaults = {
        "svcca": {"variance_threshold": 0.99, "rtol": None, "max_dims": "auto"},
        "pwcca": {"method": "svd", "variance_threshold": None, "rtol": None, "max_dims": "auto"},
        "mean_cca": {"method": "svd", "rtol": None, "max_dims": "auto"},
    }[measure]
    for key in options:
        if key not in defaults:
            raise LayersimError(
                f"unknown option {key!r} for similarity measure {measure!r}; valid options are: "
                f"{', '.join(sorted(defaults))}."
            )
    opts = {**defaults, **options}
    label = CAPPED_MEASURES[measure]
    if measure == "svcca" and opts["variance_threshold"] is None:
        raise LayersimError("svcca needs a variance_threshold in (0, 1]; use mean_cca or pwcca for plain CCA.")
    _check_method(opts.get("method", "svd"), opts.get("variance_threshold"))
    _check_threshold(opts.get("variance_threshold"))
    check_rtol(opts["rtol"])
    check_max_dims(opts["max_dims"])
    (name, a), = validated([("x", x)], label)
    return int(whiten(name, a, label, **opts).q.shape[1])


# --- checks ---


def _check_method(method: str, variance_threshold: float | None) -> None:
    if method not in METHODS:
        raise unknown_name("CCA method", method, METHODS)
    if method == "qr" and variance_threshold is not None:
        raise LayersimError(
            "method='qr' cannot apply a variance_threshold (that needs principal components); "
            "use method='svd' or variance_threshold=None."
        )


def _check_threshold(variance_threshold: float | None) -> None:
    if variance_threshold is None:
        return
    if not (isinstance(variance_threshold, (int, float)) and 0.0 < variance_threshold <= 1.0):
        raise LayersimError(f"variance_threshold must be a number in (0, 1], got {variance_threshold!r}.")
