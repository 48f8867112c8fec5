"""How fine-tuning changed one weight matrix: intruder dimensions, the spectrum's change, the update's size and rank.

Shuttleworth et al., "LoRA vs Full Fine-tuning: An Illusion of Equivalence" (arXiv 2410.21228): a left singular
vector y_j of the fine-tuned matrix W is an *intruder dimension* when its best |cosine| with every left singular
vector x_i of the pretrained W0 is below a threshold ε, ``max_i |cos(y_j, x_i)| < ε``; they count intruders among
W's top k singular vectors. Their defaults, k = 10 and ε = 0.5, are :data:`TOP_K` and :data:`THRESHOLD` (the
authors' script counts over ``U[:, :10]`` with ``--intruder_dimension_threshold 0.5``; their figures also sweep ε
from 0.5 to 0.9). Matrices are (out, in), as torch's Linear stores them, so left singular vectors live in the
output space. Everything here is NumPy in float64, whatever the weights' own dtype.
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

    def record(self) -> dict:
        """JSON-able, for plot data."""
        return {"intruders": self.intruders, "best_cosines": list(self.best_cosines),
                "pretrained_spectrum": list(self.pretrained_spectrum),
                "finetuned_spectrum": list(self.finetuned_spectrum),
                "relative_update_norm": self.relative_update_norm, "update_rank": self.update_rank,
                "shape": list(self.shape)}


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
                  eps: float | None = None) -> MatrixChange:
    """Everything :class:`MatrixChange` reports for one pair of (out, in) matrices of the same shape; `eps`: the
    machine epsilon of the dtype the weights were stored in (default: the fine-tuned array's), for the update's
    rank."""
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
                        update_rank=update_rank(w0, w, eps), shape=tuple(int(n) for n in w.shape))
