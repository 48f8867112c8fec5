"""FLOP counts of the float64 LAPACK work the weights stage does on the host (Golub and Van Loan's counts), for
:func:`layersim.plan.stages.weights`."""

from __future__ import annotations


def svd_flops(m: int, n: int) -> float:
    """A thin SVD of an m × n matrix with its left singular vectors (Golub and Van Loan's count, m ≥ n)."""
    m, n = max(m, n), min(m, n)
    return 4 * m * n * n + 22 * n ** 3


def svd_values_flops(m: int, n: int) -> float:
    """A thin SVD of an m × n matrix without its singular vectors: the bidiagonalization (Golub and Van Loan)."""
    m, n = max(m, n), min(m, n)
    return 4 * m * n * n - 4 * n ** 3 / 3


def orthonormal_frame_flops(m: int, r: int) -> float:
    """An m × r frame formed from r Householder reflectors (LAPACK dorgqr, Golub and Van Loan's count)."""
    return 2 * m * r * r - 2 * r ** 3 / 3


def intruder_null_flops(out: int, inner: int, rank: int, k: int) -> float:
    """One draw of the intruder count's rotated-update null on an out × in matrix with an update of rank r
    (layersim.similarity.weight_space.rotated_null_cosines): the short side's Haar frame (n × r, n = min(out, in));
    the long side's, as its first n rows and at most r more (by Bartlett's Wishart factor and a Cholesky QR where the
    long side has more than n + r rows); the product with the short frame unless r = n; the n × n Gram matrix of the
    (n + m) × n draw; eigh's tridiagonalisation and the k eigenvectors taken back; the cosines."""
    short, long = min(out, inner), max(out, inner)
    rest = long - short
    rows = short + min(rest, rank)
    frame = (orthonormal_frame_flops(long, rank) if rest <= rank else
             2 * rows * rank * rank + rank ** 3 / 3)  # the stacked frame's Gram, Cholesky and triangular solve
    product = 0 if rank == short else 2 * rows * short * rank
    return (orthonormal_frame_flops(short, rank) + frame + product + rows * short * short
            + 4 * short ** 3 / 3 + 4 * rows * short * k)
