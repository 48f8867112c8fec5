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

Shape: the null is a Pearson type III with the exact mean, variance and **skewness** (Kazi-Aoual et
al. 1995; FactoMineR's ``coeffRV`` fits the same curve). The third moment is derived here, not transcribed
(:func:`third_moment_coefficients`): with ``K̃ = K - tr K/(n-1) · (I - 11ᵀ/n)`` (zero row sums and zero
trace, so ``tr(K̃ P L̃ Pᵀ)`` is the centred statistic),
``E[tr(K̃ P L̃ Pᵀ)³] = Σ_k a(K̃)ᵀ M_k a(L̃) / (n)_k``,
a bilinear form in five invariants per layer ``a = (Σ_i K̃_ii³, Σ_ij K̃_ij³, tr K̃³, Σ_ij K̃_ii K̃_ij²,
Σ_ij K̃_ii K̃_ij K̃_jj)``, summed over the equality patterns of the six indices (set partitions, Möbius
inversion to distinct indices; patterns with a vertex of degree one or a lone loop vanish because rows
sum to zero and the trace is zero). tests/test_calibration.py checks it against all 5,040 permutations
at n = 7. Two of the invariants need the ``n x n`` Gram (``n² d`` work per layer, in row blocks of
bounded memory); :func:`cubic_invariants` computes them from the rows in memory, and a streamed table
gives them from its accumulator's seeded row sample (:func:`sampled_cubic_invariants`: exact while the
sample holds every row, else unbiased estimates of the sums — noisy on heavy-tailed rows, whose few largest
rows dominate them: at n = 3,000, d = 200, t(3), four 1,024-row samples gave 0.2–5.0 for an exact skewness
of 5.3, where the gamma's would be 0.03; so large streamed tables' linear CKA tails are better than before but
not exact). p-values are ``P(null >= observed)`` under that fit.
"""

from __future__ import annotations

import functools
import math

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


def _set_partitions(items: list) -> list[list[list]]:
    """Every partition of `items` into non-empty blocks."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for part in _set_partitions(rest):
        out.append([[first], *part])
        for k in range(len(part)):
            out.append(part[:k] + [[first, *part[k]]] + part[k + 1:])
    return out


def _invariant_of(vertex_of: list[int]) -> int | None:
    """Which cubic invariant (index into ``a``) the sum over the index pattern gives, with no distinctness
    constraint: slots (2e, 2e+1) are the ends of K̃'s factor e. None where it vanishes (a vertex of degree
    one: zero row sums; a component that is one loop, or two edges with a loop elsewhere: zero trace)."""
    edges = [(vertex_of[2 * e], vertex_of[2 * e + 1]) for e in range(3)]
    vertices = set(vertex_of)
    degree = {v: sum((a == v) + (b == v) for a, b in edges) for v in vertices}
    loops = [a for a, b in edges if a == b]
    if min(degree.values()) < 2 or len(vertices) > 3:
        return None
    if len(vertices) == 1:
        return 0  # Σ_i K̃_ii³
    if len(vertices) == 3:
        return 2 if not loops else None  # a triangle: tr K̃³ (else a loop alone in its component)
    if not loops:
        return 1  # a triple edge: Σ_ij K̃_ij³
    if len(loops) == 3:
        return None  # two components, one a lone loop
    if len(loops) == 1:
        return 3  # a double edge and a loop: Σ_ij K̃_ii K̃_ij²
    return 4 if len(set(loops)) == 2 else None  # a loop at each end of an edge: Σ_ij K̃_ii K̃_ij K̃_jj


@functools.cache
def third_moment_coefficients() -> dict[int, np.ndarray]:
    """``{k: M_k}`` (5 x 5) with ``E[tr(K̃ P L̃ Pᵀ)³] = Σ_k a(K̃)ᵀ M_k a(L̃) / (n)_k`` (module docstring).

    For an equality pattern σ of the six indices (i1 j1 i2 j2 i3 j3) with k distinct values, the permuted
    side's sum over distinct values averages to ``B_σ / (n)_k``; the sums over distinct values are Möbius
    inversions of the unconstrained sums over the coarser patterns, ``A_σ = Σ_{τ ≥ σ} μ(σ, τ) A*_τ``."""
    out = {k: np.zeros((5, 5)) for k in range(1, 7)}
    for sigma in _set_partitions(list(range(6))):
        v = np.zeros(5)
        for rho in _set_partitions(list(range(len(sigma)))):
            vertex_of = [0] * 6
            for label, group in enumerate(rho):
                for block in group:
                    for slot in sigma[block]:
                        vertex_of[slot] = label
            which = _invariant_of(vertex_of)
            if which is not None:
                v[which] += math.prod((-1) ** (len(g) - 1) * math.factorial(len(g) - 1) for g in rho)
        out[len(sigma)] += np.outer(v, v)
    return out


# Rows of the Gram taken at a time by cubic_invariants: about 32 MB of float64 scratch.
_GRAM_BLOCK_BYTES = 1 << 25


def _shifted_trace_cube(eigenvalues: np.ndarray, n: int, shift: float) -> float:
    """``tr K̃³`` from the nonzero spectrum of K (padded with zeros to n, less the constant vector's)."""
    return float(np.sum((eigenvalues - shift) ** 3) + (n - len(eigenvalues) - 1) * (-shift) ** 3)


def cubic_invariants(named: Named) -> np.ndarray:
    """Per layer (rows) the five invariants ``a(K̃)`` of the module docstring over ``(tr K²)^{3/2}`` (scale
    free), from the centred rows: ``n² d`` work per layer in row blocks of the Gram (bounded memory)."""
    out = []
    for name, a in named:
        c = centre(name, a, "CKA")
        n, d = c.shape
        rows = np.einsum("ij,ij->i", c, c)
        small = c.T @ c if d <= n else c @ c.T
        shift = rows.sum() / (n - 1)
        diag = rows - shift * (1 - 1 / n)
        spectrum = np.clip(np.linalg.eigvalsh(small), 0.0, None)
        cube = _shifted_trace_cube(spectrum, n, shift)
        block = max(1, _GRAM_BLOCK_BYTES // (8 * n))
        u = r = b = 0.0
        for start in range(0, n, block):
            g = c[start:start + block] @ c.T + shift / n
            g[np.arange(len(g)), np.arange(start, start + len(g))] -= shift
            squares = g * g  # not g ** 3: numpy's pow is ~50x slower than products
            u += float(np.sum(squares * g))
            r += float(diag[start:start + block] @ squares.sum(axis=1))
            b += float(diag[start:start + block] @ (g @ diag))
        out.append(np.array([np.sum(diag ** 3), u, cube, r, b]) / np.sum(small * small) ** 1.5)
    return np.array(out)


def sampled_cubic_invariants(sample: np.ndarray, mean: np.ndarray, n: int, trace: float,
                             cross: np.ndarray) -> np.ndarray:
    """:func:`cubic_invariants` of one layer of n rows from a uniform sample of its rows (m × d, not centred),
    its mean, ``tr K`` and its centred cross-products ``cross = Xcᵀ Xc``: ``tr K̃³`` exactly (from the
    spectrum of `cross`), the sums over rows and over pairs of rows as unbiased estimates (the sample's sums
    times ``n/m`` and ``n(n-1)/(m(m-1))``); exact when the sample holds every row."""
    c = np.asarray(sample, dtype=np.float64) - mean
    m = len(c)
    shift = trace / (n - 1)
    diag = np.einsum("ij,ij->i", c, c) - shift * (1 - 1 / n)
    off = c @ c.T + shift / n
    np.fill_diagonal(off, 0.0)
    single = n / m * np.sum(diag ** 3)
    pairs = n * (n - 1) / (m * (m - 1)) if m > 1 else 0.0
    cube = _shifted_trace_cube(np.clip(np.linalg.eigvalsh(cross), 0.0, None), n, shift)
    squares = off * off
    out = [single, single + pairs * np.sum(squares * off), cube, single + pairs * (diag @ squares.sum(axis=1)),
           single + pairs * (diag @ off @ diag)]
    return np.array(out) / np.sum(cross * cross) ** 1.5


def skewness(n: int, invariants_x: np.ndarray, invariants_y: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The exact permutation skewness of RV for every pair (x layers × y layers), from the scale-free
    invariants of :func:`cubic_invariants` and the exact variance (x × y) of :func:`moments`."""
    # A pattern of k distinct indices has no instance among n < k rows: its term is exactly 0 (its sums are empty,
    # (n)_k = 0), not 0/0.
    terms = [(k, m) for k, m in third_moment_coefficients().items() if k <= n]
    third = sum(invariants_x @ m @ invariants_y.T / float(math.perm(n, k)) for k, m in terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        return third / np.asarray(var) ** 1.5


def pearson3_null(observed: np.ndarray, mean: np.ndarray, var: np.ndarray,
                  skew: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """95th percentile and ``P(null >= observed)`` of the Pearson type III null with these moments; `skew`
    None takes the gamma's ``2 sd / mean`` (the fit used where the exact third moment is not known)."""
    sd = np.sqrt(var)
    point = sd <= _POINT_MASS_SD_RTOL * mean
    safe_sd = np.where(point, 1.0, sd)
    skew = 2.0 * safe_sd / mean if skew is None else np.where(point | ~np.isfinite(skew), 0.0, skew)
    p_value = scipy.stats.pearson3.sf(observed, skew, loc=mean, scale=safe_sd)
    p95 = scipy.stats.pearson3.ppf(0.95, skew, loc=mean, scale=safe_sd)
    # A point mass (a layer spanning every centred direction): every permutation gives the mean.
    p_value = np.where(point, (observed <= mean * (1 + _POINT_MASS_RTOL)).astype(float), p_value)
    p95 = np.where(point, mean, p95)
    return np.asarray(p95, dtype=float), np.asarray(p_value, dtype=float)
