"""Linear alignment maps: least squares and the CCA family as maps from X's space to Y's (Ren et al.
2023, §3.3).

All of them act on standardised coordinates (see :mod:`layersim.align.base`) as one matrix::

    ŷ_s = x_s M        (M: d_x x d_y; both sides are centred on the training rows, so no intercept)

which in original units is ``ŷ = (x - mean_x) / std_x · M · std_y + mean_y``. With ``Xs``, ``Ys`` the
standardised training rows (``n x d``):

* **linear** — least squares, ``M = argmin ||Xs M - Ys||_F² + ridge · n · ||M||_F²``, i.e.
  ``M = (XsᵀXs/n + ridge·I)⁻¹ XsᵀYs/n``; ``ridge`` is relative to unit feature variance.
  ``ridge = 0`` takes the minimum-norm least-squares solution (``lstsq``), so rank-deficient X is fine.
  (Ren et al. train ``nn.Linear`` with Adam on the same objective; this is its exact minimiser.)

* **cca** — Ren et al. eq. (6): the transformation ``W_X W_Y⁻¹``. CCA (eqs. 3–5) gives directions
  ``W_X`` (``d_x x c``), ``W_Y`` (``d_y x c``) whose canonical variates ``U = Xs W_X`` and ``V = Ys W_Y``
  have orthonormal columns and ``UᵀV = diag(ρ)``, ρ the canonical correlations in decreasing order.
  A row is taken to X's canonical space, its canonical variates are used (ω = 1) or scaled to their
  least-squares prediction (ω = ρ) as Y's, and Y's canonical variates are mapped back to Y::

      M = W_X · diag(ω) · Λ_Y        ω = 1 (Ren, default)   or   ω = ρ (scale_by_correlation=True)
      Λ_Y = Vᵀ Ys  (c x d_y)         the least-squares regression of Ys on its canonical variates V

  (``V`` has orthonormal columns, so ``(VᵀV)⁻¹VᵀYs = VᵀYs``.) Ren's eq. (6) writes ``W_Y⁻¹`` for the
  way back; ``Λ_Y = W_Y⁻¹`` exactly when ``W_Y`` is square and invertible (all components kept and
  ``rank Ys = d_y ≤ rank Xs``), so there the map is Ren's formula. Otherwise ``W_Y`` has no inverse,
  and its pseudo-inverse is *not* the least-squares way back (it projects in Y's feature space, not
  onto the rows' canonical variates): with ``d_x < d_y`` the ρ-scaled map through ``W_Y⁺`` had
  held-out MSE 6x that of least squares (32.5 vs 5.4 on a 12 → 15 example). ``Λ_Y`` makes the
  ρ-scaled map with all components equal to least squares for any widths and ranks: the
  least-squares prediction ``P_X Ys`` only involves the part of Ys in the span of ``V`` (the rest
  is orthogonal to X), and ``P_X V = U diag(ρ)``, so ``P_X Ys = U diag(ρ) VᵀYs = Xs W_X diag(ρ) Λ_Y``.

  Computed from thin SVDs ``Xs = Q_X S_X R_Xᵀ`` (rank ``r_X``), ``Ys = Q_Y S_Y R_Yᵀ`` and
  ``Q_XᵀQ_Y = A diag(ρ) Bᵀ``: ``W_X = R_X S_X⁻¹ A``, ``W_Y = R_Y S_Y⁻¹ B`` (first ``c`` columns),
  ``Λ_Y = Bᵀ S_Y R_Yᵀ``. With both sides full rank and ``c = d_x = d_y`` this is, in covariance terms
  (``K = Σ_xx^{-1/2} Σ_xy Σ_yy^{-1/2} = U_K diag(ρ) V_Kᵀ``)::

      ω = 1:  M = Σ_xx^{-1/2} · U_K V_Kᵀ · Σ_yy^{1/2}   (whiten X, rotate, re-colour as Y)
      ω = ρ:  M = Σ_xx⁻¹ Σ_xy                           (exactly least squares)

  so Ren's map assumes every canonical pair is perfectly correlated, and the ρ-scaled map is the
  best linear predictor of Y's canonical variates from X's. ``num_components`` keeps only the top
  ``c`` pairs (Ren: "we have to pre-determine the number of canonical correlations c"); the way
  back is then the regression of Ys on its top ``c`` canonical variates.

* **svcca** — the same map after an SVD that keeps, separately on each side, the fewest principal
  directions ``P_X`` (``d_x x k_X``), ``P_Y`` (``d_y x k_Y``) explaining ``variance_threshold`` of the
  variance (Raghu et al. 2017)::

      M = P_X · W'_X diag(ω) Λ'_Y · P_Yᵀ       (W', Λ' from CCA between Xs P_X and Ys P_Y)

  Ren et al. score SVCCA in the reduced space; this map returns full Y rows (the projection
  ``P_Yᵀ`` back is exact for the kept directions and zero on the dropped ones, which count as error).

* **pwcca** — *layersim's* importance-weighted CCA map, not Ren's (Ren et al. define no PWCCA map: "a
  weighted average over the coefficients"): the CCA map with each canonical direction weighted by its
  importance to X, PWCCA's weights (Morcos et al. 2018; Ren eqs. 7–9) ``α_i = Σ_j |⟨p_i, x_j⟩|``
  (``p_i = Xs w_X^i``, unit norm; ``x_j`` X's centred training columns) — taken here in the standardised
  coordinates the map acts on, so that rescaling one neuron of X changes the map no more than CCA's or
  least squares' (in X's own units, as the ``pwcca`` measure takes them, an outlier neuron 100× larger
  than the rest would set the weights alone). They say how much of X's neurons the i-th canonical variate
  accounts for; the map scales each variate by its weight relative to the largest one::

      M = W_X · diag(ω ⊙ α / max α) · Λ_Y

  so it is CCA's map exactly when every direction is equally important (α all equal), and otherwise
  shrinks the variates that few neurons carry towards Y's mean instead of transferring them at full
  scale. Normalising by ``max α`` (rather than by ``mean α``, which also gives CCA for equal weights)
  never amplifies a variate beyond CCA's ω: on a one-factor example (10 neurons, 200 training rows)
  the mean-normalised map had held-out MSE 15 against CCA's 0.53, the max-normalised one 0.30.
  Its error below CCA's (as in Ren's Table 4) is built in, not a finding: for a unit-variance variate of
  correlation ρ any shrinkage ω ∈ (2ρ − 1, 1) gives ``E(v − ωu)² = 1 − 2ωρ + ω²`` below CCA's ``2 − 2ρ``,
  and the least-squares optimum ω = ρ is ``cca`` with ``scale_by_correlation=True`` (equal to ``linear``
  with every component), the map to read it beside. The fit also records ``projection_weights_``
  (α / Σ α in X's own units) and the PWCCA similarity ``Σ α_i ρ_i / Σ α_i`` (eq. 7) from them, equal to
  :func:`layersim.similarity.pwcca` with ``max_dims=None``.

Inverse: every linear map has one when ``M`` is square and numerically full rank
(``x_s = ŷ_s M⁻¹``); otherwise ``inverse`` raises. For ``cca`` with ω = 1 that is ``W_Y W_X⁻¹``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layersim.align.base import AlignmentMap, ArrayMemo, _bool, _float, _non_negative_float, _optional_positive_int
from layersim.errors import LayersimError
from layersim.compute.linalg import canonical_pairs, default_rtol, numerical_rank, thin_svd, variance_rank
from layersim.similarity._cca_core import projection_alphas


class MatrixMap(AlignmentMap):
    """A map ``ŷ_s = x_s M`` in standardised coordinates; subclasses compute ``matrix_`` (d_x x d_y).

    The linear maps fit as one group (:func:`~layersim.align.base.fit_maps`): maps fitted on the same rows
    share one thin SVD per side and one set of canonical pairs (:class:`SharedDecompositions`), e.g. the
    four linear methods of one layer pair take two SVDs instead of eleven."""

    @classmethod
    def _group_key(cls) -> type:
        return MatrixMap

    @classmethod
    def _fit_group(cls, maps: Sequence[MatrixMap], data: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        shared = SharedDecompositions()
        for fitted, (xs, ys) in zip(maps, data):
            fitted._fit_shared(xs, ys, shared)

    def _fit_shared(self, xs: np.ndarray, ys: np.ndarray, shared: SharedDecompositions) -> None:
        raise NotImplementedError

    def _transform(self, xs: np.ndarray) -> np.ndarray:
        return xs @ self.matrix_

    def _inverse(self, ys: np.ndarray) -> np.ndarray:
        m = self.matrix_
        if m.shape[0] != m.shape[1]:
            raise LayersimError(f"the {self.name!r} map is {m.shape[0]} x {m.shape[1]} (not square), so it has no "
                                "inverse; inverse needs equal widths of x and y.")
        # A looser tolerance than the rank rule: solving with a nearly singular M amplifies noise.
        rank = numerical_rank(np.linalg.svd(m, compute_uv=False), 1e3 * default_rtol(*m.shape))
        if rank < m.shape[0]:
            raise LayersimError(f"the fitted {self.name!r} map has rank {rank} < {m.shape[0]}, so it has no inverse; "
                                "use all components (num_components=None, variance_threshold=1.0).")
        return np.linalg.solve(m.T, ys.T).T


class LinearRegressionMap(MatrixMap):
    """Least squares from standardised X to standardised Y (with intercept), optionally ridge.

    Parameters
    ----------
    ridge : float >= 0, default 0.0
        Penalty ``ridge · n · ||M||_F²`` on the standardised coefficients (1.0 is comparable to the
        unit variance of a standardised feature). 0 gives the minimum-norm least-squares fit.

    Attributes
    ----------
    matrix_ : (d_x, d_y) float64 — ``M`` in standardised coordinates (see the module docstring).
    """

    name = "linear"

    def __init__(self, ridge: float = 0.0):
        self.ridge = _non_negative_float("ridge", ridge)

    def _fit_shared(self, xs: np.ndarray, ys: np.ndarray, shared: SharedDecompositions) -> None:
        n, d = xs.shape
        if self.ridge == 0.0:  # the minimum-norm solution through X's thin SVD, with lstsq's rank rule
            q, s, r = shared.svd(xs)
            self.matrix_ = (r / s) @ (q.T @ ys)
        else:
            gram = xs.T @ xs / n + self.ridge * np.eye(d)
            self.matrix_ = np.linalg.solve(gram, xs.T @ ys / n)


class CCAMap(MatrixMap):
    """Ren et al. eq. (6): ``M = W_X diag(ω) Λ_Y`` from CCA on the standardised training rows, with
    ``Λ_Y`` the least-squares way back from Y's canonical variates (``= W_Y⁻¹`` when that exists).

    Parameters
    ----------
    num_components : int >= 1 or None, default None
        Canonical pairs kept (the top ones by correlation); None keeps ``min(rank X, rank Y)``.
    scale_by_correlation : bool, default False
        False: ω = 1, Ren's formula (canonical variates of X are used unchanged as Y's).
        True: ω = ρ, the least-squares prediction of Y's canonical variates (= linear regression,
        for any widths, when all components are kept).

    Attributes
    ----------
    matrix_ : (d_x, d_y) — ``M``;  correlations_ : (c,) — ρ, decreasing;
    x_directions_ : (d_x, c) — ``W_X``;  y_directions_ : (d_y, c) — ``W_Y`` (standardised coordinates);
    y_loadings_ : (c, d_y) — ``Λ_Y``.
    """

    name = "cca"

    def __init__(self, num_components: int | None = None, scale_by_correlation: bool = False):
        self.num_components = _optional_positive_int("num_components", num_components)
        self.scale_by_correlation = _bool("scale_by_correlation", scale_by_correlation)

    def _fit_shared(self, xs: np.ndarray, ys: np.ndarray, shared: SharedDecompositions) -> None:
        w_x, w_y, rho, loadings = canonical_map(xs, ys, shared, self.num_components)
        self.x_directions_, self.y_directions_, self.correlations_, self.y_loadings_ = w_x, w_y, rho, loadings
        weights = rho if self.scale_by_correlation else np.ones_like(rho)
        self.matrix_ = (w_x * (weights * self._importance(xs))) @ loadings

    def _importance(self, xs: np.ndarray) -> np.ndarray | float:
        """Each canonical direction's weight in the map besides ω: 1 for CCA."""
        return 1.0


class PWCCAMap(CCAMap):
    """layersim's importance-weighted CCA map (not Ren's, who define none): CCA's map (Ren eq. 6) with each
    canonical direction weighted by its importance to X, ``M = W_X diag(ω ⊙ α / max α) Λ_Y`` (see the module
    docstring); equal to :class:`CCAMap`'s with the same options when all ``α_i`` are equal.

    Parameters: as for :class:`CCAMap`. Extra attributes after ``fit``:

    importance_ : (c,) — ``α_i / max α`` in (0, 1], the factor each canonical variate is scaled by, with
        ``α_i = Σ_j |⟨p_i, x_j⟩|`` over X's standardised training columns (unchanged by rescaling a neuron).
    projection_weights_ : (c,) — ``α_i / Σ α`` (Ren eq. 8) with ``x_j`` X's centred training columns in
        their own units, as the ``pwcca`` measure.
    similarity_ : float — ``Σ_i α_i ρ_i / Σ_i α_i`` (Ren eq. 7), in [0, 1].
    """

    name = "pwcca"

    def _importance(self, xs: np.ndarray) -> np.ndarray:
        variates = xs @ self.x_directions_  # orthonormal columns p_i
        # The similarity: X's centred neurons in their own units (Morcos et al.; the pwcca measure).
        measure = projection_alphas(variates.T @ (xs * self.x_scaler_.scale_))
        self.projection_weights_ = measure / measure.sum()
        self.similarity_ = float(self.projection_weights_ @ self.correlations_)
        # The map: in the standardised coordinates it acts on, so that one rescaled neuron changes nothing.
        alpha = projection_alphas(variates.T @ xs)
        self.importance_ = alpha / alpha.max()
        return self.importance_


class SVCCAMap(MatrixMap):
    """SVCCA as a map: keep the principal directions explaining ``variance_threshold`` of each side's
    variance, then the CCA map between the reduced spaces, then back to Y's full space.

    Parameters
    ----------
    variance_threshold : float in (0, 1], default 0.99
        Fraction of the (standardised) variance the kept directions must explain, per side.
        1.0 keeps every direction of non-zero variance (then the map equals ``cca``).
    num_components, scale_by_correlation : as for :class:`CCAMap`, applied in the reduced spaces.

    Attributes
    ----------
    matrix_ : (d_x, d_y) — ``P_X W'_X diag(ω) Λ'_Y P_Yᵀ``;  kept_ : (k_X, k_Y) — directions kept;
    correlations_ : (c,) — canonical correlations between the reduced spaces.
    """

    name = "svcca"

    def __init__(self, variance_threshold: float = 0.99, num_components: int | None = None,
                 scale_by_correlation: bool = False):
        threshold = _float("variance_threshold", variance_threshold)
        if not 0.0 < threshold <= 1.0:
            raise LayersimError(f"variance_threshold must be in (0, 1], got {variance_threshold!r}.")
        self.variance_threshold = threshold
        self.num_components = _optional_positive_int("num_components", num_components)
        self.scale_by_correlation = _bool("scale_by_correlation", scale_by_correlation)

    def _fit_shared(self, xs: np.ndarray, ys: np.ndarray, shared: SharedDecompositions) -> None:
        # The principal directions kept are the top right singular vectors of each side (the SVCCA variance
        # rule, as the svcca measure); CCA between the reduced rows x_s P_X = Q_k S_k needs no new SVD.
        self.kept_ = tuple(variance_rank(shared.svd(a)[1], self.variance_threshold) for a in (xs, ys))
        w_x, _, rho, loadings = canonical_map(xs, ys, shared, self.num_components, *self.kept_)
        self.correlations_ = rho
        weights = rho if self.scale_by_correlation else np.ones_like(rho)
        self.matrix_ = (w_x * weights) @ loadings


# --- the linear algebra (rank and variance rules, thin SVD, canonical pairs: layersim.compute.linalg) ---


class SharedDecompositions:
    """The thin SVDs and canonical pairs of one group of fits: each distinct array of standardised rows is
    decomposed once, and each pair of arrays (with the principal directions kept) paired once."""

    def __init__(self) -> None:
        self._svds = ArrayMemo(thin_svd)
        self._pairs: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def svd(self, a: np.ndarray, keep: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``a``'s thin SVD (Q, S, R) to its numerical rank, or to its top ``keep`` directions."""
        q, s, r = self._svds(a)
        return (q, s, r) if keep is None else (q[:, :keep], s[:keep], r[:, :keep])

    def canonical_pairs(self, xs: np.ndarray, ys: np.ndarray, keep_x: int | None, keep_y: int | None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A, ρ, Bᵀ) of :func:`layersim.compute.linalg.canonical_pairs` between the (kept) left singular vectors."""
        q_x, q_y = self.svd(xs, keep_x)[0], self.svd(ys, keep_y)[0]
        if not q_x.shape[1] or not q_y.shape[1]:
            raise LayersimError("a representation is constant on the training rows (rank 0), so CCA is undefined; "
                                "drop that layer or use more training rows.")
        key = (id(self._svds(xs)), id(self._svds(ys)), keep_x, keep_y)
        if key not in self._pairs:
            self._pairs[key] = canonical_pairs(q_x, q_y)
        return self._pairs[key]


def canonical_map(xs: np.ndarray, ys: np.ndarray, shared: SharedDecompositions, num_components: int | None = None,
                  keep_x: int | None = None, keep_y: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CCA of centred ``xs`` (n x d_x) and ``ys`` (n x d_y), or of their top ``keep_x`` / ``keep_y`` principal
    directions, as directions in feature space.

    Returns ``(W_X, W_Y, ρ, Λ_Y)``: ``xs W_X`` and ``ys W_Y`` have orthonormal columns with
    ``(xs W_X)ᵀ (ys W_Y) = diag(ρ)``, ρ decreasing in [0, 1], ``c = min(rank, num_components)`` of each;
    ``Λ_Y = (ys W_Y)ᵀ ys`` (c x d_y) is the least-squares way back from Y's canonical variates. From the thin
    SVDs ``xs = Q_X S_X R_Xᵀ``, ``ys = Q_Y S_Y R_Yᵀ`` and ``Q_XᵀQ_Y = A diag(ρ) Bᵀ``: ``W_X = R_X S_X⁻¹ A``,
    ``W_Y = R_Y S_Y⁻¹ B``, ``Λ_Y = Bᵀ S_Y R_Yᵀ`` — the same canonical pairs as the similarity measures.
    """
    (_, s_x, r_x), (_, s_y, r_y) = shared.svd(xs, keep_x), shared.svd(ys, keep_y)
    a, rho, bt = shared.canonical_pairs(xs, ys, keep_x, keep_y)
    c = rho.size if num_components is None else min(num_components, rho.size)
    return (r_x / s_x) @ a[:, :c], (r_y / s_y) @ bt[:c].T, rho[:c], (bt[:c] * s_y) @ r_y.T
