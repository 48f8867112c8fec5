"""How fine-tuning changed one weight matrix: intruder dimensions, the spectrum's change, the update's size and rank.

Shuttleworth et al., "LoRA vs Full Fine-tuning: An Illusion of Equivalence" (arXiv 2410.21228): a left singular
vector y_j of the fine-tuned matrix W is an *intruder dimension* when its best |cosine| with every left singular
vector x_i of the pretrained W0 is below a threshold ε, ``max_i |cos(y_j, x_i)| < ε``; they count intruders among
W's top k singular vectors. Their defaults, k = 10 and ε = 0.5, are :data:`TOP_K` and :data:`THRESHOLD` (the
authors' script counts over ``U[:, :10]`` with ``--intruder_dimension_threshold 0.5``; their figures also sweep ε
from 0.5 to 0.9). Matrices are (out, in), as torch's Linear stores them, so left singular vectors live in the
output space. Everything here is NumPy in float64, whatever the weights' own dtype.

The count has a null (:func:`rotated_update_counts`): the update W − W0 with its singular values kept and its
singular vectors drawn at random (Haar) in the matrix's output and input spaces. A structureless update of the same
rank and size produces intruders too (a rank-8 update at 10 % of W0's norm with a decaying spectrum does on
MiniLM's 384 × 384 matrices), so a count means something only against what such an update gives. The null is drawn in
W0's own singular bases, where it needs W0's singular values only (:func:`rotated_null_cosines`), and a pretrained
matrix's SVD is taken once for every fine-tuned matrix compared with it (:class:`Pretrained`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOP_K = 10
THRESHOLD = 0.5


@dataclass(frozen=True)
class MatrixChange:
    """What fine-tuning did to one (out, in) weight matrix."""

    intruders: int                      # top-k fine-tuned singular vectors with best |cos| below the threshold
    best_cosines: tuple[float, ...]     # each top-k fine-tuned singular vector's best |cos| with a pretrained one
    pretrained_spectrum: tuple[float, ...]  # W0's top-k singular values
    finetuned_spectrum: tuple[float, ...]   # W's top-k singular values
    relative_update_norm: float         # ||W - W0||_F / ||W0||_F
    update_rank: int                    # singular values of W - W0 above the stored dtype's rounding floor
    shape: tuple[int, int]
    # The intruder count of each draw of the rotated-update null (:func:`rotated_update_counts`); () without one.
    null_intruders: tuple[int, ...] = ()

    @property
    def null_mean(self) -> float | None:
        """The intruder count the null expects (None without a null)."""
        return float(np.mean(self.null_intruders)) if self.null_intruders else None

    @property
    def p_value(self) -> float | None:
        """One-sided Monte Carlo p-value of the observed count under the null (None without one)."""
        return null_p_value(self.intruders, self.null_intruders) if self.null_intruders else None

    def record(self) -> dict:
        """JSON-able, for plot data."""
        return {"intruders": self.intruders, "best_cosines": list(self.best_cosines),
                "pretrained_spectrum": list(self.pretrained_spectrum),
                "finetuned_spectrum": list(self.finetuned_spectrum),
                "relative_update_norm": self.relative_update_norm, "update_rank": self.update_rank,
                "shape": list(self.shape), "null_mean": self.null_mean, "p_value": self.p_value}


@dataclass(frozen=True)
class Pretrained:
    """A pretrained (out, in) matrix in float64 with its thin SVD's left singular vectors and singular values: taken
    once and shared by every fine-tuned matrix compared with it (each run of the weights stage)."""

    matrix: np.ndarray
    left: np.ndarray    # (out, min(out, in)): every left singular vector
    values: np.ndarray  # descending

    @classmethod
    def of(cls, matrix: "np.ndarray | Pretrained") -> "Pretrained":
        if isinstance(matrix, Pretrained):
            return matrix
        matrix = np.asarray(matrix, dtype=np.float64)
        left, values, _ = np.linalg.svd(matrix, full_matrices=False)
        return cls(matrix, left, values)


def best_cosines(pretrained: "np.ndarray | Pretrained", finetuned: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """For each of the top-k left singular vectors of `finetuned`, its largest |cosine| with any left singular
    vector of `pretrained` (all min(out, in) of them, as in the paper). Singular vectors are unit vectors, so the
    cosine is their dot product; |.| because a singular vector's sign is arbitrary."""
    finetuned_u = np.linalg.svd(np.asarray(finetuned, dtype=np.float64), full_matrices=False)[0][:, :k]
    return _best_cosines(Pretrained.of(pretrained).left, finetuned_u)


def _best_cosines(pretrained_u: np.ndarray, finetuned_u: np.ndarray) -> np.ndarray:
    return np.abs(finetuned_u.T @ pretrained_u).max(axis=1)


def count_intruders(pretrained: "np.ndarray | Pretrained", finetuned: np.ndarray, k: int = TOP_K,
                    threshold: float = THRESHOLD) -> int:
    """The number of intruder dimensions among the top k singular vectors of `finetuned` (module doc)."""
    return int((best_cosines(pretrained, finetuned, k) < threshold).sum())


def null_p_value(observed: float, null: np.ndarray | tuple) -> float:
    """``(1 + #{null ≥ observed}) / (1 + draws)``: the Monte Carlo p-value that counts the observation as a draw, so
    that it is valid (never below its level under the null) for counts with ties, as intruder counts have."""
    null = np.asarray(null)
    return float((1 + np.sum(null >= observed)) / (1 + null.size))


def haar_frame(rng: np.random.Generator, dim: int, rank: int) -> np.ndarray:
    """A (dim, rank) matrix with orthonormal columns drawn uniformly (Haar): the Q of a Gaussian matrix's QR with R's
    diagonal positive. Drawn as Householder QR would find it (Stewart 1980): the reflector of step j is that of a
    fresh Gaussian vector of length dim − j, as the Gaussian matrix's remaining block is again Gaussian after any
    reflection; LAPACK's dorgqr forms the product. Half the random numbers and about half the work of the QR of a
    drawn Gaussian matrix, exact where a Cholesky QR loses orthogonality with the square Gaussian's condition."""
    from scipy.linalg import lapack

    if not 0 < rank <= dim:
        raise ValueError(f"a frame needs 0 < rank <= dim, got rank {rank} and dim {dim}")
    vectors, below = np.zeros((dim, rank), order="F"), np.tri(dim, rank, dtype=bool)
    vectors[below] = rng.standard_normal(int(below.sum()))  # column j's vector: its rows j and below
    alpha = vectors[np.arange(rank), np.arange(rank)].copy()
    beta = -np.copysign(np.linalg.norm(vectors, axis=0), alpha)  # dlarfg's: the reflected vector is beta · e_j
    vectors /= alpha - beta  # the reflector's vector, scaled to 1 on the diagonal (dorgqr reads below it only)
    frame, _, info = lapack.dorgqr(vectors, (beta - alpha) / beta, lwork=max(1, 64 * rank), overwrite_a=True)
    if info:
        raise RuntimeError(f"LAPACK dorgqr failed (info {info})")
    return frame * np.sign(beta)  # R's diagonal is beta: positive in the Haar convention


def _long_frame(rng: np.random.Generator, short: int, long: int, rank: int) -> np.ndarray:
    """A (short + m, rank) matrix with orthonormal columns, m = min(long − short, rank), whose first `short` rows
    are distributed as those of a Haar (long, rank) frame and whose last m rows stand for the frame's other
    long − short rows: their Gram matrix has the same distribution, and a Gram matrix over the short side sees
    nothing else of them. With at most `rank` other rows, the frame itself. With more: the frame is ``G R^-1`` for a
    Gaussian (long, rank) G, ``R^T R = G_top^T G_top + W`` with ``W = G_rest^T G_rest`` Wishart(long − short, rank),
    which Bartlett's decomposition draws as ``L L^T`` (L lower triangular, its diagonal chi-distributed with
    long − short − i degrees of freedom, Gaussian below): rank² numbers instead of (long − short) · rank, and a frame
    of 2 · 384 rows instead of 1536 for MiniLM's intermediate matrices. The stacked (G_top; L^T) has at least
    2 · rank + 1 rows, so its Cholesky QR (``G R^-1`` by BLAS products) is well conditioned."""
    from scipy.linalg import solve_triangular

    rest = long - short
    if rest <= rank:
        return haar_frame(rng, long, rank)
    stacked = np.empty((short + rank, rank))
    stacked[:short] = rng.standard_normal((short, rank))
    bottom = stacked[short:]
    bottom[:] = np.triu(rng.standard_normal((rank, rank)), 1)  # L^T: upper triangular
    bottom[np.diag_indices(rank)] = np.sqrt(rng.chisquare(rest - np.arange(rank)))
    lower = np.linalg.cholesky(stacked.T @ stacked)
    return solve_triangular(lower, stacked.T, lower=True, check_finite=False).T


def rotated_null_cosines(pretrained_values: np.ndarray, update_values: np.ndarray, shape: tuple[int, int],
                         k: int = TOP_K, draws: int = 100, rng: np.random.Generator | None = None) -> np.ndarray:
    """(draws, min(k, out, in)): each draw's best |cosines| (:func:`best_cosines`) of W0 + U' diag(s) V'^T against
    W0, for W0 of `shape` with singular values `pretrained_values` (all min(out, in) of them, descending), s the
    `update_values` and U' (out × r), V' (in × r) Haar-random.

    Drawn in W0's singular bases, which is exact in distribution (a Haar frame stays Haar under an orthogonal map):
    there W0 is the diagonal D of its singular values, padded to `shape`, and the cosines with W0's left singular
    vectors are the coordinates of the draw's left singular vectors on the first n = min(out, in) axes. With the
    long side as rows, T = D + F diag(s) Q^T for F the long side's frame (:func:`_long_frame`: its first n rows and
    at most r more, r the update's rank) and Q the short side's (n × r). For a full-rank update (r = n) the
    product is skipped: X = T Q = D Q + F diag(s) has T's left singular vectors, and Q^T times its right ones.
    The top k eigenvectors of the n × n Gram matrix X^T X (eigh on a subset) then give the short side's singular
    vectors, X times them the long side's."""
    from scipy.linalg import eigh

    rng = np.random.default_rng() if rng is None else rng
    out, inner = shape
    short, long = min(shape), max(shape)
    sigma, s = np.asarray(pretrained_values, dtype=np.float64), np.asarray(update_values, dtype=np.float64)
    rank, k = s.size, min(k, short)
    if sigma.shape != (short,) or not 0 < rank <= short:
        raise ValueError(f"need min(out, in) = {short} pretrained singular values and 1 to {short} update ones, got "
                         f"{sigma.size} and {rank}")
    cosines = np.empty((draws, k))
    for draw in range(draws):
        frame, turn = _long_frame(rng, short, long, rank) * s, haar_frame(rng, short, rank)
        if rank == short:
            x = frame
            x[:short] += sigma[:, None] * turn
        else:
            x = frame @ turn.T
            x[np.diag_indices(short)] += sigma
        _, vectors = eigh(x.T @ x, subset_by_index=[short - k, short - 1], overwrite_a=True, check_finite=False)
        vectors = vectors[:, ::-1]
        if out > inner:  # the cosines are on the long side: T's left singular vectors, their first n coordinates
            left = x @ vectors
            found = np.abs(left[:short]) / np.maximum(np.linalg.norm(left, axis=0), np.finfo(np.float64).tiny)
        else:  # on the short side: T's right singular vectors
            found = np.abs(turn @ vectors if rank == short else vectors)
        cosines[draw] = found.max(axis=0)
    return cosines


def rotated_update_counts(pretrained: "np.ndarray | Pretrained", finetuned: np.ndarray, k: int = TOP_K,
                          threshold: float = THRESHOLD, draws: int = 100, rng: np.random.Generator | None = None,
                          eps: float | None = None) -> np.ndarray:
    """The intruder count of `draws` structureless updates of the observed one's size: W0 + U' diag(s) V'^T, with
    s the singular values of W − W0 above the stored dtype's rounding floor (its rank r, as :func:`update_rank`
    reads it) and U' (out × r), V' (in × r) Haar-random (:func:`rotated_null_cosines`). What an update of that rank
    and spectrum gives when its directions owe nothing to W0; an unchanged matrix gives zeros."""
    pretrained = Pretrained.of(pretrained)
    values = _update_values(pretrained.matrix, finetuned, eps)
    return _null_counts(pretrained, values, k, threshold, draws, rng)


def _null_counts(pretrained: Pretrained, update_values: np.ndarray, k: int, threshold: float, draws: int,
                 rng: np.random.Generator | None) -> np.ndarray:
    if not update_values.size:
        return np.zeros(draws, dtype=int)
    cosines = rotated_null_cosines(pretrained.values, update_values, pretrained.matrix.shape, k, draws, rng)
    return (cosines < threshold).sum(axis=1)


def _update_values(pretrained: np.ndarray, finetuned: np.ndarray, eps: float | None) -> np.ndarray:
    """The singular values of W − W0 above :func:`rounding_floor` for the machine epsilon `eps` (default: the
    fine-tuned array's dtype's)."""
    eps = machine_epsilon(finetuned) if eps is None else eps
    update = np.asarray(finetuned, dtype=np.float64) - np.asarray(pretrained, dtype=np.float64)
    values = np.linalg.svd(update, compute_uv=False)
    return values[values > rounding_floor(finetuned, eps)]


def machine_epsilon(array: np.ndarray) -> float:
    """The relative spacing of `array`'s floating dtype (0 for integers: stored exactly)."""
    dtype = np.asarray(array).dtype
    return float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 0.0


def rounding_floor(finetuned: np.ndarray, eps: float) -> float:
    """A bound on the spectral norm of the error of storing `finetuned` with relative spacing `eps`: each entry is
    off by at most half an ulp, ``eps/2 · |W_ij|``, so the error's Frobenius norm (≥ its spectral norm) is at most
    ``eps/2 · ||W||_F``; twice that leaves room for the rounding of a merged product (LoRA's B @ A)."""
    return eps * float(np.linalg.norm(np.asarray(finetuned, dtype=np.float64)))


def update_rank(pretrained: np.ndarray, finetuned: np.ndarray, eps: float | None = None) -> int:
    """The numerical rank of W - W0: its singular values above :func:`rounding_floor` for the machine epsilon
    `eps` of the dtype the weights were stored in (default: the fine-tuned array's own). A merged LoRA update of
    rank r gives at most r, whatever rounding the merge added."""
    return int(_update_values(pretrained, finetuned, eps).size)


def matrix_change(pretrained: "np.ndarray | Pretrained", finetuned: np.ndarray, k: int = TOP_K,
                  threshold: float = THRESHOLD, eps: float | None = None, null_draws: int = 0,
                  rng: np.random.Generator | None = None) -> MatrixChange:
    """Everything :class:`MatrixChange` reports for one pair of (out, in) matrices of the same shape (`pretrained`
    also as a :class:`Pretrained`, whose SVD is then not taken again); `eps`: the machine epsilon of the dtype the
    weights were stored in (default: the fine-tuned array's), for the update's rank; with `null_draws`, the
    intruder counts of that many draws of the rotated-update null (from `rng`)."""
    finetuned = np.asarray(finetuned)
    shape = pretrained.matrix.shape if isinstance(pretrained, Pretrained) else np.shape(pretrained)
    if shape != finetuned.shape or len(shape) != 2:
        raise ValueError(f"pretrained and fine-tuned matrices must be 2-D of one shape, got {shape} "
                         f"and {finetuned.shape}")
    eps = machine_epsilon(finetuned) if eps is None else eps
    pretrained, w = Pretrained.of(pretrained), finetuned.astype(np.float64)
    finetuned_u, spectrum_after, _ = np.linalg.svd(w, full_matrices=False)
    cosines = _best_cosines(pretrained.left, finetuned_u[:, :k])
    update = _update_values(pretrained.matrix, finetuned, eps)
    base_norm = float(np.linalg.norm(pretrained.values))
    relative = float(np.linalg.norm(w - pretrained.matrix)) / base_norm if base_norm else float("inf")
    return MatrixChange(intruders=int((cosines < threshold).sum()), best_cosines=tuple(map(float, cosines)),
                        pretrained_spectrum=tuple(map(float, pretrained.values[:k])),
                        finetuned_spectrum=tuple(map(float, spectrum_after[:k])), relative_update_norm=relative,
                        update_rank=int(update.size), shape=tuple(int(n) for n in w.shape),
                        null_intruders=tuple(int(n) for n in _null_counts(
                            pretrained, update, k, threshold, null_draws, rng)) if null_draws else ())
