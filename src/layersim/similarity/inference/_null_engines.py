"""Per-measure engines for the permutation null (:mod:`layersim.similarity.inference.null`).

Shuffling the rows of ``y`` commutes with everything each measure computes per layer: centring,
standardising neurons, orthonormal (SVD/QR) bases, PWCCA coordinates, centred kernels. So each
engine computes every layer's statistics ONCE, and a permutation ``π`` only row-permutes the y-side
statistics (a basis ``Q[π]``, a kernel ``K[π][:, π]``) before the cheap per-pair work (the machinery:
:mod:`~layersim.similarity.inference._device_engines`):

* *product* engines (linear and debiased CKA in feature space, the CCA family, neuronsim,
  mixedsim, the shape metrics): the y-side matrices of all layers are stacked into one ``(n, Σ b_j)`` array,
  permuted once per permutation, and each x layer's ``A_iᵀ B[π]`` is one GEMM against the whole stack; each
  cell then reduces its block (sum of squares, singular values, max |r|, column norms);
* *kernel* engines (linear and debiased CKA in sample space, RBF CKA, RSA): ``<K_i, L_j[π][:, π]>`` is
  ``<K_i[σ][:, σ], L_j>`` with ``σ = π⁻¹``, so the side with fewer kernels in the requested cells is gathered (one
  flat index per permutation for every kernel) and all inner products are one GEMM of the flattened kernels.

The per-permutation work runs in torch, float64, on the analysis device (:func:`layersim.compute.device.analysis_on`:
the GPU in a stage whose ``device`` is one, the CPU otherwise), a batch of permutations at a time
(``values_batch``: as many as :func:`~layersim.compute.device.analysis_batch` lets fit), so that a GPU's thousands of
cores see products of ``P`` permutations at once and the CPU pays Python's per-call cost once per batch. The layers'
statistics are prepared once, in numpy float64, on the host. Float64 throughout: the values equal the measures'
own functions (:func:`layersim.similarity.similarity_matrix` on ``ys[j][π]``) to rounding, so a seed gives the same
p-values on every device (tests/test_device_null.py).

Two host-side engines serve the rest (:mod:`~layersim.similarity.inference._host_engines`): ``RowsEngine``
(per-layer statistics made once, the y side's permuted per draw and the pair recomputed: the neighbourhood measures,
the matchings, aligned cosine) and ``RecomputedEngine``, the generic engine of a measure that has no engine of its own
(its matrix recomputed on the permuted rows; the registry installs it).

``values(perm)`` returns the ``(len(xs), len(ys))`` array of the measure between ``xs[i]`` and
``ys[j][perm]`` for the requested cells (NaN elsewhere); ``perm=None`` is the observed matrix;
``values_batch(perms)`` the ``(P, len(xs), len(ys))`` array for ``P`` permutations (rows of ``perms``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from layersim.errors import LayersimError, unknown_name
import layersim.similarity.cca as cca
import layersim.similarity.cka as cka
import layersim.similarity.kernels as kernels
import layersim.similarity.neurons as neurons
from layersim.similarity._common import Named, centre, check_rtol, validated
from layersim.similarity.inference._device_engines import (  # noqa: F401  (torch, on_device: the engines' own)
    Finish, KernelEngine, ProductEngine, _DeviceEngine, _Engine, _sum_of_squares, analysis_device, on_device, torch)


# --- linear and debiased CKA ---


def _use_gram(method: str, n: int, widths_x, widths_y, num_x: int, num_y: int) -> bool:
    """Sample space when asked, or for "auto" when the permuted kernels cost less than the feature GEMMs."""
    if method != "auto":
        return method == "gram"
    kernel_bytes = 8.0 * (num_x + 2 * num_y) * n * n
    # Per permutation, on the kernels' upper triangles: the inner products, plus the scattered copy K[σ][:, σ] of the
    # smaller side's kernels (KernelEngine), which runs at memory speed (counted as ~30 multiply-adds an entry).
    gram_cost = (num_x * num_y + 30.0 * min(num_x, num_y)) * n * n / 2
    feature_cost = n * float(sum(widths_x)) * float(sum(widths_y))
    return kernel_bytes <= cka.GRAM_BYTES_LIMIT and gram_cost < feature_cost


def cka_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, method: str = "auto",
               debiased: bool = False) -> _Engine:
    """Linear CKA (or debiased linear CKA) between ``xs[i]`` and ``ys[j][π]``."""
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    label = "debiased CKA" if debiased else "CKA"
    checked = validated(x_named + (y_named or []), label, min_rows=4 if debiased else 2)
    xc = [centre(name, a, label) for name, a in checked[: len(x_named)]]
    yc = xc if y_named is None else [centre(name, a, label) for name, a in checked[len(x_named):]]
    n = xc[0].shape[0]
    self_x = np.array([np.sum((c.T @ c) ** 2) for c in xc])
    self_y = self_x if y_named is None else np.array([np.sum((c.T @ c) ** 2) for c in yc])
    rows_x = np.stack([np.einsum("ij,ij->i", c, c) for c in xc])
    rows_y = rows_x if y_named is None else np.stack([np.einsum("ij,ij->i", c, c) for c in yc])

    device = analysis_device()
    rows_x_t = on_device(rows_x, device)
    rows_y_t = rows_x_t if y_named is None else on_device(rows_y, device)
    if debiased:
        def unbiased(cross, kx, ky):  # n(n-3)·HSIC_1, as kernels._debiased_cka; ky (…, layers, n), batched or not
            return cross - n / (n - 2.0) * torch.matmul(kx, ky.transpose(-1, -2)) + \
                kx.sum(-1)[:, None] * ky.sum(-1)[..., None, :] / ((n - 1.0) * (n - 2.0))

        def self_terms(self_hsic, rows):
            return torch.diagonal(unbiased(torch.diag(on_device(self_hsic, device)), rows, rows)).cpu().numpy()
        den_x = kernels._checked_self(self_terms(self_x, rows_x_t), self_x, checked)
        den_y = den_x if y_named is None else kernels._checked_self(self_terms(self_y, rows_y_t), self_y,
                                                                    checked[len(x_named):])
        norm = on_device(np.sqrt(den_x)[:, None] * np.sqrt(den_y)[None, :], device)

        def finish(cross: torch.Tensor, perms: torch.Tensor | None) -> torch.Tensor:
            ky = rows_y_t if perms is None else rows_y_t[:, perms].transpose(0, 1)  # (P, layers, n)
            return (unbiased(cross, rows_x_t, ky) / norm).clamp(-1.0, 1.0)
    else:
        norm = on_device(np.sqrt(self_x)[:, None] * np.sqrt(self_y)[None, :], device)

        def finish(cross: torch.Tensor, perms: torch.Tensor | None) -> torch.Tensor:
            return (cross / norm).clamp(0.0, 1.0)

    widths_x, widths_y = [c.shape[1] for c in xc], [c.shape[1] for c in yc]
    if _use_gram(method, n, widths_x, widths_y, len(xc), len(yc)):
        kx = np.stack([c @ c.T for c in xc])
        ky = kx if y_named is None else np.stack([c @ c.T for c in yc])
        return KernelEngine(cells, kx, ky, finish)
    return _Finished(ProductEngine(cells, xc, yc, _sum_of_squares), finish)


class _Finished(_DeviceEngine):
    """A product engine whose raw per-cell values are finished by a whole-matrix function."""

    def __init__(self, inner: ProductEngine, finish: Finish):
        super().__init__(inner.cells)
        self.inner, self.finish = inner, finish

    def bytes_per_permutation(self) -> float:
        return self.inner.bytes_per_permutation()

    def raw(self, perms: torch.Tensor | None) -> torch.Tensor:
        return self.finish(self.inner.raw(perms), perms)


def rbf_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, sigma_scale: float = 1.0,
               exact_max_rows: int = kernels.RBF_EXACT_MAX_ROWS, landmarks: int = kernels.RBF_LANDMARKS,
               landmark_seed: int = 0) -> _Engine:
    """Exact kernels only: above `exact_max_rows` the measure is Nyström-approximated and this engine refuses
    (`landmarks`, `landmark_seed` are the measure's options for that route, unused here)."""
    if not (isinstance(sigma_scale, (int, float)) and np.isfinite(sigma_scale) and sigma_scale > 0):
        raise LayersimError(f"sigma_scale must be a positive number, got {sigma_scale!r}.")
    num_rows = np.shape(x_named[0][1])[0]
    if num_rows > exact_max_rows:
        raise LayersimError(f"RBF CKA on n = {num_rows} examples is Nyström-approximated (above exact_max_rows = "
                            f"{exact_max_rows}), and its null and bootstrap engine computes exact n x n kernels only; "
                            "raise exact_max_rows or use fewer examples.")
    checked = validated(x_named + (y_named or []), "RBF CKA")
    kx = np.stack([kernels.centred_rbf_kernel(name, a, sigma_scale) for name, a in checked[: len(x_named)]])
    ky = kx if y_named is None else np.stack(
        [kernels.centred_rbf_kernel(name, a, sigma_scale) for name, a in checked[len(x_named):]])
    norm_x = np.sqrt(np.einsum("kij,kij->k", kx, kx))
    norm_y = norm_x if y_named is None else np.sqrt(np.einsum("kij,kij->k", ky, ky))
    norm = on_device(norm_x[:, None] * norm_y[None, :], analysis_device())
    return KernelEngine(cells, kx, ky, lambda inner, perms: (inner / norm).clamp(0.0, 1.0))


# --- CCA family ---


def _cca_bases(x_named, y_named, label, **kwargs) -> tuple[list[cca.Basis], list[cca.Basis]]:
    """Every layer's whitened basis, cut as the measure cuts it (rank, variance, max_dims)."""
    cca.check_max_dims(kwargs.get("max_dims"))
    checked = validated(x_named + (y_named or []), label)
    bx = [cca.whiten(name, a, label, **kwargs) for name, a in checked[: len(x_named)]]
    by = bx if y_named is None else [cca.whiten(name, a, label, **kwargs) for name, a in checked[len(x_named):]]
    return bx, by


def svcca_engine(x_named, y_named, cells, *, variance_threshold: float = 0.99, rtol: float | None = None,
                 max_dims: int | str | None = "auto"):
    if variance_threshold is None:
        raise LayersimError("svcca needs a variance_threshold in (0, 1]; use mean_cca or pwcca for plain CCA.")
    cca._check_threshold(variance_threshold)
    check_rtol(rtol)
    bx, by = _cca_bases(x_named, y_named, "SVCCA", method="svd", variance_threshold=variance_threshold, rtol=rtol,
                        max_dims=max_dims)

    def reduce(i, j, blocks):
        return torch.linalg.svdvals(blocks).clamp(0.0, 1.0).mean(dim=-1)

    return ProductEngine(cells, [b.q for b in bx], [b.q for b in by], reduce)


def mean_cca_engine(x_named, y_named, cells, *, method: str = "svd", rtol: float | None = None,
                    max_dims: int | str | None = "auto"):
    cca._check_method(method, None)
    check_rtol(rtol)
    bx, by = _cca_bases(x_named, y_named, "CCA", method=method, rtol=rtol, max_dims=max_dims)

    def reduce(i, j, blocks):
        # Σ ρ² = ||Qxᵀ Qy||_F²: no SVD needed.
        return (_sum_of_squares(i, j, blocks) / min(blocks.shape[-2:])).clamp(max=1.0)

    return ProductEngine(cells, [b.q for b in bx], [b.q for b in by], reduce)


def pwcca_engine(x_named, y_named, cells, *, method: str = "svd", variance_threshold: float | None = None,
                 rtol: float | None = None, max_dims: int | str | None = "auto"):
    cca._check_method(method, variance_threshold)
    cca._check_threshold(variance_threshold)
    check_rtol(rtol)
    bx, by = _cca_bases(x_named, y_named, "PWCCA", method=method, variance_threshold=variance_threshold,
                        rtol=rtol, keep_coords=True, max_dims=max_dims)

    device = analysis_device()
    coords = {i: on_device(bx[i].coords, device) for i in np.flatnonzero(cells.any(axis=1))}

    def reduce(i, j, blocks):
        # Weights from x's neurons, whose coordinates do not move under a permutation of y: Σ α_k ρ_k / Σ α_k with
        # α_k = Σ_j |h_kᵀ xc_j| (cca._pw_weighted, batched).
        u, rho, _ = torch.linalg.svd(blocks, full_matrices=False)
        alpha = torch.matmul(u.transpose(-1, -2), coords[i]).abs().sum(dim=-1)
        return ((alpha * rho.clamp(0.0, 1.0)).sum(dim=-1) / alpha.sum(dim=-1)).clamp(0.0, 1.0)

    return ProductEngine(cells, [b.q for b in bx], [b.q for b in by], reduce)


# --- neuron-level ---


def neuronsim_engine(x_named, y_named, cells):
    checked = validated(x_named + (y_named or []), "neuronsim")
    zx = [neurons.standardise(name, a, "neuronsim").z for name, a in checked[: len(x_named)]]
    zy = zx if y_named is None else [neurons.standardise(name, a, "neuronsim").z for name, a in checked[len(x_named):]]

    def reduce(i, j, blocks):
        # max |r| = max(max r, −min r): one pass over the products, none of them copied (|·| was a second pass).
        low, high = torch.aminmax(blocks, dim=-1)
        return torch.maximum(high, low.neg()).mean(dim=-1).clamp(max=1.0)

    return ProductEngine(cells, zx, zy, reduce)


def mixedsim_engine(x_named, y_named, cells, *, method: str = "svd", rtol: float | None = None):
    neurons._check(method, rtol)
    checked = validated(x_named + (y_named or []), "mixedsim")
    x_checked = checked[: len(x_named)]
    y_checked = x_checked if y_named is None else checked[len(x_named):]
    rows = set(np.flatnonzero(cells.any(axis=1)).tolist())
    cols = set(np.flatnonzero(cells.any(axis=0)).tolist())
    # Only the layers a requested cell uses need each role (a regressor basis may legitimately fail).
    zx = [neurons.standardise(name, a, "mixedsim").z if i in rows else None for i, (name, a) in enumerate(x_checked)]
    qy = [neurons._regressor_basis(name, a, method, rtol).q if j in cols else np.zeros((a.shape[0], 0))
          for j, (name, a) in enumerate(y_checked)]

    def reduce(i, j, blocks):
        # blocks = Zxᵀ Qy[π]: row k holds the coordinates of neuron k's least-squares prediction.
        return blocks.square().sum(dim=-1).sqrt().clamp(max=1.0).mean(dim=-1)

    return ProductEngine(cells, zx, qy, reduce)


ENGINES: dict[str, Callable[..., _Engine]] = {
    "linear_cka": cka_engine,
    "debiased_cka": lambda x, y, cells, **o: cka_engine(x, y, cells, debiased=True, **o),
    "rbf_cka": rbf_engine,
    "svcca": svcca_engine,
    "pwcca": pwcca_engine,
    "mean_cca": mean_cca_engine,
    "neuronsim": neuronsim_engine,
    "mixedsim": mixedsim_engine,
}
