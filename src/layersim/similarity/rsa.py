"""Representational similarity analysis (Kriegeskorte et al. 2008) in rsatoolbox's conventions.

Each layer gives a representational dissimilarity matrix (RDM) over the examples, ``rdm``:

* ``"correlation"`` (default; rsatoolbox ``calc_rdm(method="correlation")``): ``1 − r(x_a, x_b)``, the Pearson
  correlation of two examples' rows across the layer's neurons (each row centred and scaled to unit norm);
* ``"euclidean"`` (rsatoolbox ``method="euclidean"``): the squared Euclidean distance ``‖x_a − x_b‖²`` divided by
  the width, as rsatoolbox divides it (a scale, which no comparison below sees).

Two RDMs are compared over their upper triangles (the ``n(n − 1)/2`` pairs of examples), ``compare``:

* ``"spearman"`` (default; rsatoolbox ``compare(method="spearman")``): the Pearson correlation of the ranks
  (ties get their average rank, scipy's ``rankdata``), robust to any monotone relation between the two
  geometries, as Kriegeskorte et al. recommend;
* ``"pearson"`` (rsatoolbox ``"corr"``): the Pearson correlation of the dissimilarities;
* ``"cosine"`` (rsatoolbox ``"cosine"``, its default): their uncentred cosine.

rsatoolbox's ``"kendall"`` / ``"tau-a"`` are not offered: ``O(m log m)`` over ``m = n(n − 1)/2`` entries for every
draw of a null, where these three are one inner product of prepared matrices.

The value lies in [−1, 1] and is 1 for a layer against itself. Sizes: every layer's RDM is ``n × n`` (8·n² bytes
in float64, 20 GB at n = 50,000), and the null engine holds every layer's at once, so RSA refuses above
:data:`RSA_MAX_ROWS` rows with a sentence (:func:`check_rsa_sizes`, run by ``check_computable`` before any data
are loaded). It has no streamed route: the RDM needs every pair of rows, not the second moments a streamed
table gives. A row permutation ``π`` of ``y`` permutes its RDM as ``D[π][:, π]`` and ranks commute with it, so
the null only permutes the prepared matrices (:func:`rsa_engine`).

A bootstrap resample holds copies of one example, whose dissimilarity is 0 in *every* RDM: compared, these
pairs would be agreement made by the resampling. ``sources`` (which source example each row copies;
:func:`layersim.similarity.inference.bootstrap.resampled_options` passes it) leaves the pairs of copies of one source out
of the comparison, as rsatoolbox's bootstrap treats them as missing (Schütt et al. 2023, "Statistical
inference on representational geometries"); all other pairs count with their multiplicity. Without
``sources`` the value is the plain one, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from layersim.errors import LayersimError, unknown_name
from layersim.similarity._common import Named, _constant_error, named_lists, validated
from layersim.similarity.cka import is_constant
from layersim.similarity.inference._device_engines import KernelEngine
from layersim.similarity._pairs import fill_matrix

RDMS = ("correlation", "euclidean")
COMPARISONS = ("spearman", "pearson", "cosine")
RSATOOLBOX_NAMES = {"spearman": "spearman", "pearson": "corr", "cosine": "cosine"}
# Above this many rows every RDM is > 200 MB and a matrix of 39 layers > 8 GB: refused, not allocated.
RSA_MAX_ROWS = 5_000


def check_rsa_sizes(num_rows: int, width: int, name: str) -> None:
    """Refuse more than :data:`RSA_MAX_ROWS` rows before anything is allocated (``Measure.check_sizes``)."""
    if num_rows > RSA_MAX_ROWS:
        raise LayersimError(
            f"rsa on n = {num_rows} examples would hold an n x n dissimilarity matrix per layer "
            f"({8 * num_rows ** 2 / 2 ** 30:.1f} GiB each), above its limit of {RSA_MAX_ROWS} rows; use fewer "
            "examples (extract.max_examples) or a measure that streams (linear_cka, svcca, procrustes).")


def _check(rdm: str, compare: str) -> None:
    if rdm not in RDMS:
        raise unknown_name("RDM distance", rdm, RDMS)
    if compare not in COMPARISONS:
        raise unknown_name("RDM comparison", compare, COMPARISONS)


def rdm(name: str, a: np.ndarray, kind: str = "correlation") -> np.ndarray:
    """The ``n × n`` dissimilarity matrix of one layer's rows (float64, zero diagonal), rsatoolbox's ``kind``."""
    a = np.asarray(a, dtype=np.float64)
    if kind == "correlation":
        rows = a - a.mean(axis=1, keepdims=True)
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        flat = np.flatnonzero(norms <= 1e-12 * np.maximum(np.abs(a).max(axis=1), np.finfo(float).tiny))
        if flat.size:
            raise LayersimError(f"{name} has {flat.size} example(s) whose row is the same in every neuron (first: "
                                f"row {flat[0]}), so their correlation distance is undefined; use rdm='euclidean'.")
        rows /= norms[:, None]
        out = 1.0 - rows @ rows.T
    else:
        squares = np.einsum("ij,ij->i", a, a)
        out = np.maximum(squares[:, None] + squares[None, :] - 2.0 * (a @ a.T), 0.0) / a.shape[1]
    np.fill_diagonal(out, 0.0)
    return out


def _prepared(name: str, a: np.ndarray, kind: str, compare: str, sources: np.ndarray | None = None) -> np.ndarray:
    """The RDM's upper triangle as compared (ranked and centred, centred, or raw), placed back in a symmetric
    zero-diagonal matrix scaled to unit Frobenius norm: the comparison is then the matrices' inner product.
    Pairs of rows of one source (``sources``) are left out: 0 in the matrix, out of the ranks and the mean."""
    check_rsa_sizes(a.shape[0], a.shape[1], name)
    if is_constant(a):  # every example the same: no geometry to compare
        raise _constant_error(name, "RSA")
    d = rdm(name, a, kind)
    upper = np.triu_indices(d.shape[0], k=1)
    if sources is not None:
        distinct = sources[upper[0]] != sources[upper[1]]
        upper = (upper[0][distinct], upper[1][distinct])
    values = d[upper]
    if compare == "spearman":
        values = rankdata(values)
    if compare != "cosine":
        values = values - values.mean()
    norm = np.linalg.norm(values)
    if not norm > 1e-12 * max(1.0, float(np.abs(values).max())):
        raise LayersimError(f"{name}'s dissimilarities are all equal, so its {compare} RSA is undefined; drop that "
                            "layer or check how it was extracted.")
    out = np.zeros_like(d)
    out[upper] = values / (np.sqrt(2.0) * norm)
    return out + out.T


def _stats(named: Named, rdm: str, compare: str, sources: np.ndarray | None = None) -> list[np.ndarray]:
    _check(rdm, compare)
    checked = validated(named, "RSA", min_rows=3)
    if sources is not None:
        sources = np.asarray(sources)
        if sources.shape != (checked[0][1].shape[0],):
            raise LayersimError(f"sources has shape {sources.shape}; expected one source id per row, "
                                f"({checked[0][1].shape[0]},).")
    return [_prepared(name, a, rdm, compare, sources) for name, a in checked]


def _inner(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.clip(np.einsum("ij,ij->", a, b), -1.0, 1.0))


def rsa(x: np.ndarray, y: np.ndarray, *, rdm: str = "correlation", compare: str = "spearman",
        sources: np.ndarray | None = None) -> float:
    """The ``compare`` correlation of the two layers' ``rdm`` RDMs (see the module docstring); with
    ``sources``, over the pairs of rows of different sources only."""
    a, b = _stats([("x", x), ("y", y)], rdm, compare, sources)
    return _inner(a, b)


def rsa_matrix(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, *, rdm: str = "correlation",
               compare: str = "spearman", sources: np.ndarray | None = None) -> np.ndarray:
    """[i, j] = :func:`rsa` ``(xs[i], ys[j])``; each layer's RDM prepared once."""
    x_named, y_named = named_lists(xs, ys)
    stats = _stats(x_named + (y_named or []), rdm, compare, sources)
    sx, sy = stats[: len(x_named)], (None if y_named is None else stats[len(x_named):])
    return fill_matrix(sx, sy, _inner, symmetric=True)


def rsa_engine(x_named: Named, y_named: Named | None, cells: np.ndarray, *, rdm: str = "correlation",
               compare: str = "spearman", sources: np.ndarray | None = None) -> KernelEngine:
    """The permutation-null engine: the prepared RDMs of y permuted as ``D[π][:, π]`` (their ranks and mean do
    not move), each cell one inner product. With ``sources`` (a bootstrap resample) only ``values(None)``."""
    stats = _stats(x_named + (y_named or []), rdm, compare, sources)
    kx = np.stack(stats[: len(x_named)])
    ky = kx if y_named is None else np.stack(stats[len(x_named):])
    return KernelEngine(cells, kx, ky, lambda inner, perms: inner.clamp(-1.0, 1.0))
