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
MiniLM's 384 × 384 matrices), so a count means something only against what such an update gives.
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


def best_cosines(pretrained: np.ndarray, finetuned: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """For each of the top-k left singular vectors of `finetuned`, its largest |cosine| with any left singular
    vector of `pretrained` (all min(out, in) of them, as in the paper). Singular vectors are unit vectors, so the
    cosine is their dot product; |.| because a singular vector's sign is arbitrary."""
    pretrained_u = np.linalg.svd(np.asarray(pretrained, dtype=np.float64), full_matrices=False)[0]
    finetuned_u = np.linalg.svd(np.asarray(finetuned, dtype=np.float64), full_matrices=False)[0][:, :k]
    return np.abs(finetuned_u.T @ pretrained_u).max(axis=1)


def count_intruders(pretrained: np.ndarray, finetuned: np.ndarray, k: int = TOP_K,
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
    diagonal positive, here by Cholesky (G R^-1 with R^T R = G^T G: BLAS products, several times faster than
    Householder QR on 1536 × 384, and well conditioned for a Gaussian G with rank ≤ dim)."""
    from scipy.linalg import solve_triangular

    gaussian = rng.standard_normal((dim, rank))
    lower = np.linalg.cholesky(gaussian.T @ gaussian)
    return solve_triangular(lower, gaussian.T, lower=True).T


def _top_left_vectors(matrix: np.ndarray, k: int) -> np.ndarray:
    """`matrix`'s top k left singular vectors from the top of the smaller Gram matrix's eigenvectors (eigh on a
    subset: 3–10× faster than a full SVD; the null draws many of these, and an error of 1e-8 in a cosine is
    immaterial beside a threshold of 0.5)."""
    from scipy.linalg import eigh

    out, inner = matrix.shape
    k = min(k, out, inner)
    if out <= inner:
        _, vectors = eigh(matrix @ matrix.T, subset_by_index=[out - k, out - 1])
        return vectors[:, ::-1]
    _, right = eigh(matrix.T @ matrix, subset_by_index=[inner - k, inner - 1])
    left = matrix @ right[:, ::-1]
    return left / np.maximum(np.linalg.norm(left, axis=0), np.finfo(np.float64).tiny)


def rotated_update_counts(pretrained: np.ndarray, finetuned: np.ndarray, k: int = TOP_K,
                          threshold: float = THRESHOLD, draws: int = 100, rng: np.random.Generator | None = None,
                          eps: float | None = None) -> np.ndarray:
    """The intruder count of `draws` structureless updates of the observed one's size: W0 + U' diag(s) V'^T, with
    s the singular values of W − W0 above the stored dtype's rounding floor (its rank r, as :func:`update_rank`
    reads it) and U' (out × r), V' (in × r) Haar-random. What an update of that rank and spectrum gives when its
    directions owe nothing to W0; an unchanged matrix gives zeros."""
    w0, w = np.asarray(pretrained, dtype=np.float64), np.asarray(finetuned, dtype=np.float64)
    eps = machine_epsilon(finetuned) if eps is None else eps
    values = np.linalg.svd(w - w0, compute_uv=False)
    values = values[values > rounding_floor(finetuned, eps)]
    if not values.size:
        return np.zeros(draws, dtype=int)
    rng = np.random.default_rng() if rng is None else rng
    pretrained_u = np.linalg.svd(w0, full_matrices=False)[0]
    out, inner = w0.shape
    counts = np.empty(draws, dtype=int)
    for draw in range(draws):
        update = (haar_frame(rng, out, values.size) * values) @ haar_frame(rng, inner, values.size).T
        cosines = np.abs(_top_left_vectors(w0 + update, k).T @ pretrained_u).max(axis=1)
        counts[draw] = int((cosines < threshold).sum())
    return counts


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
    eps = machine_epsilon(finetuned) if eps is None else eps
    update = np.asarray(finetuned, dtype=np.float64) - np.asarray(pretrained, dtype=np.float64)
    values = np.linalg.svd(update, compute_uv=False)
    return int((values > rounding_floor(finetuned, eps)).sum())


def matrix_change(pretrained: np.ndarray, finetuned: np.ndarray, k: int = TOP_K, threshold: float = THRESHOLD,
                  eps: float | None = None, null_draws: int = 0,
                  rng: np.random.Generator | None = None) -> MatrixChange:
    """Everything :class:`MatrixChange` reports for one pair of (out, in) matrices of the same shape; `eps`: the
    machine epsilon of the dtype the weights were stored in (default: the fine-tuned array's), for the update's
    rank; with `null_draws`, the intruder counts of that many draws of the rotated-update null (from `rng`)."""
    pretrained, finetuned = np.asarray(pretrained), np.asarray(finetuned)
    if pretrained.shape != finetuned.shape or pretrained.ndim != 2:
        raise ValueError(f"pretrained and fine-tuned matrices must be 2-D of one shape, got {pretrained.shape} "
                         f"and {finetuned.shape}")
    eps = machine_epsilon(finetuned) if eps is None else eps
    w0, w = pretrained.astype(np.float64), finetuned.astype(np.float64)
    cosines = best_cosines(w0, w, k)
    spectrum_before = np.linalg.svd(w0, compute_uv=False)[:k]
    spectrum_after = np.linalg.svd(w, compute_uv=False)[:k]
    base_norm = float(np.linalg.norm(w0))
    relative = float(np.linalg.norm(w - w0)) / base_norm if base_norm else float("inf")
    return MatrixChange(intruders=int((cosines < threshold).sum()), best_cosines=tuple(map(float, cosines)),
                        pretrained_spectrum=tuple(map(float, spectrum_before)),
                        finetuned_spectrum=tuple(map(float, spectrum_after)), relative_update_norm=relative,
                        update_rank=update_rank(w0, w, eps), shape=tuple(int(n) for n in w.shape),
                        null_intruders=tuple(int(n) for n in rotated_update_counts(
                            w0, w, k, threshold, null_draws, rng, eps)) if null_draws else ())
