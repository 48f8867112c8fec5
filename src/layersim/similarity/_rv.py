"""Exact permutation moments of linear CKA (the RV coefficient) and the Pearson type III null.

Linear CKA of column-centred data is Escoufier's RV coefficient ``RV = tr(K L) / sqrt(tr K² tr L²)``
with ``K = Xc Xcᵀ``, ``L = Yc Ycᵀ``. Under the permutation null (rows of ``y`` shuffled, ``L ->
L[π][:, π]``) its mean and variance are exact functions of three traces per layer (Kazi-Aoual,
Hitier, Sabatier & Lebreton 1995; Josse, Pagès & Husson 2008, eqs. 5–6), with
``T = tr K = ||Xc||_F²``, ``T2 = tr K² = ||Xcᵀ Xc||_F²`` (CKA's self-HSIC), ``S2 = Σ_i K_ii²`` (the
squared row norms, squared) and ``β = T² / T2``::

    E[RV]   = sqrt(β_x β_y) / (n - 1)
    Var[RV] = 2 / ((n+1)(n-1)²(n-2)) · [(n-1-β_x)(n-1-β_y) + (n-3)/(2n(n-1)) · ρ_x ρ_y]
    ρ       = (n-1)/(n-3) · (n(n+1) S2/T2 - (n-1)(β + 2))

(Josse et al.'s ``(n-1-β)·τ`` is ``ρ`` here, which avoids dividing by ``n-1-β = 0`` when a layer
spans every centred direction.) These cost ``O(n d)`` per layer beyond CKA itself.

Shape: the exact third moment (Kazi-Aoual et al.; FactoMineR's ``coeffRV`` fits a Pearson type III
with it) needs ``Σ_ij K_ij³``, i.e. the ``n x n`` Gram of every layer — ``n² d`` work per layer,
more than the whole CKA matrix for many examples. Instead the null is a Pearson type III with the
exact mean and variance and the skewness ``2 sd / mean`` of the gamma distribution with those two
moments (a Satterthwaite-type fit: RV ≥ 0 and its null is close to a scaled weighted sum of χ²
variables, which a gamma matches by moments). p-values are ``P(null >= observed)`` under that fit.
tests/test_null.py checks the mean and variance against sampled permutations and the p-values for
uniformity on independent data.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from layersim.errors import LayersimError
from layersim.similarity._common import Named, centre

# The variance is a difference of terms of order mean**2, so rounding leaves up to ~sqrt(eps) * mean
# of spurious standard deviation: a null whose sd is below this fraction of the mean is a point mass.
_POINT_MASS_SD_RTOL = 1e-6
# An observed value within this fraction of a point-mass null's mean equals it (p = 1).
_POINT_MASS_RTOL = 1e-9


def row_traces(named: Named) -> tuple[np.ndarray, np.ndarray]:
    """Per layer ``tr K`` and ``Σ_i K_ii²`` from the squared row norms of the centred data."""
    trace, sum_sq_diag = [], []
    for name, a in named:
        c = centre(name, a, "CKA")
        rows = np.einsum("ij,ij->i", c, c)
        trace.append(rows.sum())
        sum_sq_diag.append(rows @ rows)
    return np.array(trace), np.array(sum_sq_diag)


def moments(n: int, trace_x, trace_sq_x, diag_sq_x, trace_y, trace_sq_y, diag_sq_y):
    """Exact permutation mean and variance of RV, broadcasting x-side (column) against y-side (row) arrays."""
    if n < 4:
        raise LayersimError(f"the exact linear CKA null needs at least 4 examples, got {n}; use exact=False.")
    beta_x, beta_y = trace_x**2 / trace_sq_x, trace_y**2 / trace_sq_y
    rho_x = (n - 1) / (n - 3) * (n * (n + 1) * diag_sq_x / trace_sq_x - (n - 1) * (beta_x + 2))
    rho_y = (n - 1) / (n - 3) * (n * (n + 1) * diag_sq_y / trace_sq_y - (n - 1) * (beta_y + 2))
    mean = np.sqrt(beta_x * beta_y) / (n - 1)
    var = 2.0 / ((n + 1) * (n - 1) ** 2 * (n - 2)) * (
        (n - 1 - beta_x) * (n - 1 - beta_y) + (n - 3) / (2.0 * n * (n - 1)) * rho_x * rho_y)
    return mean, np.maximum(var, 0.0)


def pearson3_null(observed: np.ndarray, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95th percentile and ``P(null >= observed)`` of the gamma-shaped Pearson type III null."""
    sd = np.sqrt(var)
    point = sd <= _POINT_MASS_SD_RTOL * mean
    safe_sd = np.where(point, 1.0, sd)
    skew = 2.0 * safe_sd / mean
    p_value = scipy.stats.pearson3.sf(observed, skew, loc=mean, scale=safe_sd)
    p95 = scipy.stats.pearson3.ppf(0.95, skew, loc=mean, scale=safe_sd)
    # A point mass (a layer spanning every centred direction): every permutation gives the mean.
    p_value = np.where(point, (observed <= mean * (1 + _POINT_MASS_RTOL)).astype(float), p_value)
    p95 = np.where(point, mean, p95)
    return np.asarray(p95, dtype=float), np.asarray(p_value, dtype=float)
