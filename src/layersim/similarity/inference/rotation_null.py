"""The null of the measures computed from streamed moments (SVCCA, PWCCA, mean CCA, neuronsim, mixedsim),
for activation tables too large to hold: a **rotation null**, sampled from the d × d moments alone.

A permutation ``P`` of the column layer's rows cannot be applied without the rows. Replaced by a uniformly
random rotation ``H`` of the centred rows (Haar-distributed on the n − 1 dimensions orthogonal to the constant
vector), it can: with ``Qx``, ``Qy`` the orthonormal bases of the two centred layers (as in
:mod:`layersim.similarity.moments`), every quantity these measures take from ``x`` and ``H y`` is a function of
``B = Qxᵀ H Qy``, and ``B`` is distributed as the top-left ``r_x × r_y`` corner of a Haar orthogonal
``(n−1) × (n−1)`` matrix, whatever the data — drawn here without the rows (:func:`haar_corner`):

* canonical correlations: the singular values of ``B`` (SVCCA, mean CCA);
* PWCCA: ``B = U diag(ρ) Vᵀ`` with ``U`` Haar and independent of ``ρ`` (``B``'s law is invariant under
  rotations on either side), so the weights of a draw are those of an independent Haar ``U``;
* neuronsim: the correlations ``Ĉxᵀ B Ĉy`` (``Ĉ = Qᵀ Xc`` per neuron, over its norm);
* mixedsim: ``‖Bᵀ ĉ_a‖`` per x neuron a.

The rotation null and the permutation null agree in the first two moments of the cross-product:
``E[P A Pᵀ] = E[H A Hᵀ] = tr(A)/(n−1) · (I − 11ᵀ/n)`` for centred ``A``, so e.g. both give mean CCA the
null mean ``max(r_x, r_y)/(n−1)`` exactly; beyond that the rotation null is the permutation null's Gaussian
limit (a permutation keeps the rows' heavy tails, a rotation mixes them). The cells of one draw share what it
drew (the corner; the canonical correlations of one pair of ranks), as permutation nulls share a permutation.

Heavy tails, and the accumulator's row sample (:class:`LinearCKAAccumulator`'s ``sample_rows``, a seeded
uniform reservoir kept in the same pass): **while the sample holds every row** (tables of at most
``sample_rows`` rows, 1,024 by default) the null is the permutation null of those rows, exactly
:func:`~layersim.similarity.permutation_matrix` (``method`` "permutation"). Beyond it the CCA family and
mixedsim keep plain rotations, within ~0.2 permutation-sd of the permutation null on Student-t (3 dof)
neurons at n = 3,000 (mean and 95th percentile; measured in benchmarks/calibration.py's notes). neuronsim's
plain rotations are too narrow there (a max over single correlations feels each neuron's tails: mean 0.3–0.9
sd and 95th percentile 0.6–1.2 sd below, at n = 300 and 3,000), so its draws take the *shape* of the
sample's permutation null: ``mean_n + sd_n · (perm_m − mean_rot_m) / sd_rot_m`` per cell, the m-row
sample's permutation draws standardised by its own rotation null, placed at the n-row rotation null's mean
and sd (:func:`_sample_tails`). Heavy tails fade as n grows, so the m-row shape is at least as heavy as the
n-row one: conservative (measured +0.1 to +0.4 sd at n = 300 with m = 100–150 and at n = 3,000 with m = 1,024;
tests/test_calibration.py asserts |shift| < 0.35 sd at n = 300, m = 150). It costs one permutation null and
one rotation null on the m sampled rows.

Cost, independent of the number of examples: the CCA family needs only the canonical correlations, drawn per
pair of ranks from the Jacobi ensemble's tridiagonal model (:func:`canonical_correlations_draw`, O(r²)), plus,
for PWCCA, one Haar rotation per row layer; neuronsim and mixedsim draw one corner per draw (a Cholesky
factorisation of order r), then per cell a product of order d³ (neuronsim) or O(d) (mixedsim).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy.linalg import eigvalsh_tridiagonal, solve_triangular
from scipy.stats import ortho_group

from layersim.errors import LayersimError
from layersim.similarity.moments import (LayerMoments, basis_options, explained_share, moments_matrix, neuron_match,
                                         neuron_stds, pwcca_weights, weighted_correlation)
from layersim.similarity.inference.null import NullMatrix, _check_cells, _summary, permutation_matrix
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.registry import MEASURES


def haar_corner(dimension: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """The top-left ``rows × cols`` block of a Haar-random orthogonal ``dimension × dimension`` matrix.

    Its first `cols` columns are ``G R⁻¹`` for a Gaussian ``G`` (dimension × cols) and ``RᵀR = GᵀG`` (the Q of
    G's QR factorisation, Haar); only G's first `rows` rows are drawn, the rest enter through ``GᵀG`` as a
    Wishart matrix with ``dimension − rows`` degrees of freedom, drawn by Bartlett's decomposition — so the cost
    is in ``cols``, not in `dimension`.
    """
    if not 0 < rows <= dimension or not 0 < cols <= dimension:
        raise LayersimError(f"a {rows} × {cols} corner of a {dimension} × {dimension} orthogonal matrix does not exist.")
    top = rng.standard_normal((rows, cols))
    rest = dimension - rows
    if rest < cols:  # Bartlett needs the degrees of freedom ≥ the order; so few rows are cheap to draw
        below = rng.standard_normal((rest, cols))
        gram = top.T @ top + below.T @ below
    else:
        bartlett = np.tril(rng.standard_normal((cols, cols)), -1)
        bartlett[np.diag_indices(cols)] = np.sqrt(rng.chisquare(rest - np.arange(cols)))
        gram = top.T @ top + bartlett @ bartlett.T
    lower = np.linalg.cholesky(gram)  # gram = L Lᵀ, R = Lᵀ
    return solve_triangular(lower, top.T, lower=True).T  # G₁ R⁻¹ = G₁ L⁻ᵀ


def canonical_correlations_draw(dimension: int, rank_x: int, rank_y: int, rng: np.random.Generator) -> np.ndarray:
    """The singular values (descending) of a :func:`haar_corner` of `rank_x` × `rank_y`: the canonical
    correlations of two uniformly random subspaces of those dimensions in ℝ^dimension.

    Their squares follow the real Jacobi (MANOVA) ensemble, sampled here by its tridiagonal model (Killip &
    Nenciu 2004, Theorem 2; the parameters of the Gaussian full model as in Gautier, Bardenet & Valko 2019):
    2·min(r) Beta variables and a tridiagonal eigenvalue problem, O(r²) where the corner costs O(r³). When the
    subspaces must intersect (``rank_x + rank_y > dimension``) the corner is drawn instead.
    """
    p, wide = min(rank_x, rank_y), max(rank_x, rank_y)
    rest = dimension - wide
    if rest < p:
        corner = haar_corner(dimension, p, wide, rng)
        return np.sqrt(np.clip(np.linalg.eigvalsh(corner @ corner.T)[::-1], 0.0, 1.0))
    k = np.arange(p)
    odd = rng.beta((wide - k) / 2, (rest - k) / 2)
    even = np.zeros(p)
    even[1:] = rng.beta((p - k[1:]) / 2, (wide + rest - p - k[1:] + 1) / 2)
    xi_odd = (1 - even) * odd
    xi_even = np.zeros(p)
    xi_even[1:] = (1 - odd[:-1]) * even[1:]
    squares = eigvalsh_tridiagonal(xi_even + xi_odd, np.sqrt(xi_odd[:-1] * xi_even[1:]), lapack_driver="sterf")
    return np.sqrt(np.clip(squares[::-1], 0.0, 1.0))


class _Draws:
    """Draws of every cell's null value of one measure, each layer's basis work done once for all draws."""

    def __init__(self, name: str, moments: LayerMoments, options: dict):
        self.name, self.moments = name, moments
        self.options = options | {"keep_coords": name in ("pwcca", "neuronsim", "mixedsim")}
        self._unit_coords: dict[int, np.ndarray] = {}
        self._stacks: dict[tuple, tuple[np.ndarray, dict[int, slice]]] = {}

    def rank(self, layer: int) -> int:
        return self.moments.whitened(layer, **self.options).t.shape[1]

    def unit_coords(self, layer: int) -> np.ndarray:
        """``Ĉ``: the kept neurons in the layer's whitened basis, each over its norm (r × kept)."""
        if layer not in self._unit_coords:
            coords = self.moments.whitened(layer, **self.options).coords[:, self.moments.kept(layer)]
            self._unit_coords[layer] = coords / neuron_stds(self.moments, layer)
        return self._unit_coords[layer]

    def _row_stack(self, layers: tuple[int, ...], size: int) -> tuple[np.ndarray, dict[int, slice]]:
        """``Ĉᵀ`` of `layers` one above the other (float32, zero-padded to `size` basis directions) and each
        layer's rows in it."""
        if (layers, size) not in self._stacks:
            parts = [np.zeros((self.unit_coords(k).shape[1], size), dtype=np.float32) for k in layers]
            for part, k in zip(parts, layers):
                part[:, :self.rank(k)] = self.unit_coords(k).T
            ends = np.cumsum([part.shape[0] for part in parts])
            offsets = {k: slice(end - part.shape[0], end) for k, part, end in zip(layers, parts, ends)}
            self._stacks[(layers, size)] = (np.concatenate(parts), offsets)
        return self._stacks[(layers, size)]

    def values(self, cells: Sequence[tuple[int, int]], rng: np.random.Generator) -> np.ndarray:
        """One draw of every cell's null value."""
        rank = {k: self.rank(k) for cell in cells for k in cell}
        dimension = self.moments.num_rows - 1
        out = np.empty(len(cells))
        if self.name in ("neuronsim", "mixedsim"):  # the neurons need the corner itself
            size = max(rank.values())
            corner = haar_corner(dimension, size, size, rng)
        if self.name == "neuronsim":
            rows_of: dict[int, list[int]] = {}
            for c, (i, j) in enumerate(cells):
                rows_of.setdefault(j, []).append(c)
            for j, chosen in rows_of.items():
                # Every row layer's correlations with column layer j's neurons from one product, in float32 (the
                # null's correlations are ~n^-½; float32 rounding is ~1e-7 of them).
                stack, offsets = self._row_stack(tuple(sorted({cells[c][0] for c in chosen})), size)
                projected = (corner[:, :rank[j]] @ self.unit_coords(j)).astype(np.float32)
                correlations = stack @ projected
                for c in chosen:
                    out[c] = neuron_match(correlations[offsets[cells[c][0]]])
        elif self.name == "mixedsim":
            # ‖B[:r_i, :r_j]ᵀ ĉ_a‖² for every r_j at once: running sums over the rows of Bᵀ Ĉ_i.
            by_row = {i: np.cumsum((corner[:rank[i]].T @ self.unit_coords(i)) ** 2, axis=0) for i in {i for i, _ in cells}}
            for c, (i, j) in enumerate(cells):
                out[c] = explained_share(np.sqrt(by_row[i][rank[j] - 1]))
        else:  # the CCA family: canonical correlations, one draw per pair of ranks (shared by cells of a draw)
            rho = {}
            weights = {}  # PWCCA's: the variates' weights under an independent Haar rotation U (module docstring)
            for i in sorted({i for i, _ in cells}) if self.name == "pwcca" else ():
                coords = self.moments.whitened(i, **self.options).coords
                weights[i] = pwcca_weights(ortho_group.rvs(rank[i], random_state=rng).T @ coords)
            for c, (i, j) in enumerate(cells):
                key = (min(rank[i], rank[j]), max(rank[i], rank[j]))
                if key not in rho:
                    rho[key] = canonical_correlations_draw(dimension, *key, rng)
                if self.name == "svcca":
                    out[c] = float(rho[key].mean())
                elif self.name == "mean_cca":
                    out[c] = float(np.mean(rho[key] ** 2))
                else:
                    out[c] = weighted_correlation(weights[i][:len(rho[key])], rho[key])
        return out


def rotation_null(name: str, moments: LayerMoments, xs: Sequence[int], ys: Sequence[int] | None = None, *,
                  draws: int, seed: int = 0, cells: np.ndarray | None = None, observed: np.ndarray | None = None,
                  variance_threshold: float | None = None, rtol: float | None = None,
                  max_dims: int | str | None = "auto") -> NullMatrix:
    """The rotation null (module docstring) of ``moments_matrix(name, moments, xs, ys, ...)``'s cells: per cell
    the observed value, the null's mean and 95th percentile over `draws` random rotations, and the one-sided
    p-value ``(1 + #{null ≥ observed}) / (1 + draws)``; NaN outside `cells`. ``method`` is "rotation" and
    ``permutations`` the number of draws. Deterministic for a seed (``np.random.default_rng(seed)``).
    `observed`: that matrix, when already computed (else it is)."""
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise LayersimError(f"draws must be an integer >= 1, got {draws!r}.")
    if observed is None:
        observed = moments_matrix(name, moments, xs, ys, variance_threshold=variance_threshold, rtol=rtol,
                                  max_dims=max_dims)
    ys = list(xs) if ys is None else list(ys)
    if np.shape(observed) != (len(xs), len(ys)):
        raise LayersimError(f"observed must be the {len(xs)} × {len(ys)} matrix of these layers, got shape "
                            f"{np.shape(observed)}.")
    cells = _check_cells(cells, observed.shape)
    options = basis_options(name, moments, ys, variance_threshold=variance_threshold, rtol=rtol, max_dims=max_dims)
    accumulator = moments._acc
    if accumulator.sample_rows >= moments.num_rows:  # the sample is every row, in order: permute them
        given = dict(variance_threshold=variance_threshold, rtol=rtol, max_dims=max_dims)
        measure_options = {k: v for k, v in given.items() if k in MEASURES[name].options and v is not None}
        rows = [accumulator.sample(k) for k in sorted(set(xs) | set(ys))]
        where = {k: r for r, k in enumerate(sorted(set(xs) | set(ys)))}
        null = permutation_matrix(name, [rows[where[k]] for k in xs], [rows[where[k]] for k in ys],
                                  permutations=int(draws), seed=seed, cells=cells, **measure_options)
        return dataclasses.replace(null, observed=observed)
    chosen = [(xs[a], ys[b]) for a, b in np.argwhere(cells)]
    null = _rotation_draws(name, moments, options, chosen, int(draws), seed)
    if name == "neuronsim" and chosen and accumulator.sample_rows >= _MIN_SAMPLE_ROWS:
        null = _sample_tails(moments, chosen, null, seed)
    return dataclasses.replace(_summary(observed, null, cells, int(draws)), method="rotation")


# Fewer sampled rows than this give neuronsim's rotation null no tail correction.
_MIN_SAMPLE_ROWS = 20


def _rotation_draws(name: str, moments: LayerMoments, options: dict, chosen: list, draws: int, seed: int) -> np.ndarray:
    """``(draws, len(chosen))`` rotation-null values of the chosen (row layer, column layer) cells."""
    engine = _Draws(name, moments, options)
    null = np.empty((draws, len(chosen)))
    if chosen:
        rng = np.random.default_rng(seed)
        for d in range(draws):
            null[d] = engine.values(chosen, rng)
    return null


def _sample_tails(moments: LayerMoments, chosen: list, null: np.ndarray, seed: int) -> np.ndarray:
    """neuronsim's rotation draws at n rows given the shape of the permutation null of the accumulator's m-row
    sample: each draw ``mean_n + sd_n · (perm_m − mean_rot_m) / sd_rot_m`` per cell, the sample's permutation
    draws standardised by its own rotation null (module docstring)."""
    accumulator = moments._acc
    layers = sorted({k for cell in chosen for k in cell})
    where = {k: r for r, k in enumerate(layers)}
    rows = [accumulator.sample(k) for k in layers]
    local = [(where[i], where[j]) for i, j in chosen]
    small = LayerMoments.of_layers(rows)
    rotated = _rotation_draws("neuronsim", small, basis_options("neuronsim", small, [], variance_threshold=None,
                                                                rtol=None, max_dims=None), local, len(null), seed + 1)
    mask = np.zeros((len(layers), len(layers)), dtype=bool)
    mask[tuple(np.array(local).T)] = True
    engine = ENGINES["neuronsim"]([(f"layers[{k}]", r) for k, r in zip(layers, rows)], None, mask)
    rng = np.random.default_rng(seed + 2)
    index = tuple(np.array(local).T)
    permuted = np.array([engine.values(rng.permutation(len(rows[0])))[index] for _ in range(len(null))])
    scale = rotated.std(axis=0)
    shape = np.divide(permuted - rotated.mean(axis=0), scale, out=np.zeros_like(permuted), where=scale > 0)
    return null.mean(axis=0) + null.std(axis=0) * shape
