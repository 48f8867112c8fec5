"""The similarity measures by name, and the all-pairs layer × layer matrix for any of them.

::

    similarity_matrix("svcca", layers)                     # (L, L), symmetric, diagonal 1
    similarity_matrix("neuronsim", ft_layers, orig_layers)  # (L_ft, L_orig): neuronsim(ft_i, orig_j)

Every matrix computes each layer's statistics once (centred data, orthonormal bases, standardised
neurons, kernels) and only cheap per-pair work after that; entry [i, j] equals the pair function
on ``(xs[i], ys[j])``. With ``ys=None`` the layers are compared with themselves: symmetric measures
compute the upper triangle only, asymmetric ones every ordered pair (sharing work between [i, j]
and [j, i] where the measure allows), and the diagonal is exactly 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from layersim.errors import unknown_name
from layersim.similarity import cca, cka, kernels, neurons
from layersim.similarity._common import check_options
from layersim.similarity.cka import cka_matrix


@dataclass(frozen=True)
class Measure:
    """A similarity measure between ``(num_examples x hidden)`` representations.

    ``pair(x, y, **options)`` gives one value, ``matrix(xs, ys=None, **options)`` all pairs;
    ``options`` are the keyword options both accept. ``bounded`` is the (lo, hi) range of values, or
    None when unbounded. ``symmetric`` says whether ``pair(x, y) == pair(y, x)``; for an asymmetric
    measure the first argument is the side averaged over (its neurons, or its PWCCA weights).
    """

    name: str
    label: str
    symmetric: bool
    bounded: tuple[float, float] | None
    pair: Callable[..., float]
    matrix: Callable[..., np.ndarray]
    options: tuple[str, ...] = ()
    level: str = "representation"  # "neuron", "mixed" or "representation" (Wu et al.'s groups)


def _linear_cka(x: np.ndarray, y: np.ndarray, *, method: str = "auto") -> float:
    """:func:`layersim.similarity.linear_cka` with cka_matrix's ``method`` option."""
    if method not in cka.METHODS:
        raise unknown_name("method", method, cka.METHODS)
    return float(cka._cka([("x", x)], [("y", y)], method=method)[0, 0])


MEASURES: dict[str, Measure] = {
    m.name: m
    for m in [
        Measure("linear_cka", "linear CKA", True, (0.0, 1.0), _linear_cka, cka_matrix, ("method",)),
        Measure("rbf_cka", "RBF CKA", True, (0.0, 1.0), kernels.rbf_cka, kernels.rbf_cka_matrix, ("sigma_scale",)),
        Measure("debiased_cka", "debiased linear CKA", True, (-1.0, 1.0), kernels.debiased_cka,
                kernels.debiased_cka_matrix, ("method",)),
        Measure("svcca", "SVCCA", True, (0.0, 1.0), cca.svcca, cca.svcca_matrix,
                ("max_dims", "rtol", "variance_threshold")),
        Measure("pwcca", "PWCCA", False, (0.0, 1.0), cca.pwcca, cca.pwcca_matrix,
                ("max_dims", "method", "rtol", "variance_threshold")),
        Measure("mean_cca", "mean CCA R²", True, (0.0, 1.0), cca.mean_cca_r2, cca.mean_cca_matrix,
                ("max_dims", "method", "rtol")),
        Measure("neuronsim", "neuronsim", False, (0.0, 1.0), neurons.neuronsim, neurons.neuronsim_matrix, (),
                level="neuron"),
        Measure("mixedsim", "mixedsim", False, (0.0, 1.0), neurons.mixedsim, neurons.mixedsim_matrix,
                ("method", "rtol"), level="mixed"),
    ]
}


def get_measure(name: str) -> Measure:
    """The :class:`Measure` called ``name``; an unknown name raises a LayersimError listing the valid ones."""
    if name not in MEASURES:
        raise unknown_name("similarity measure", name, MEASURES)
    return MEASURES[name]


def similarity(name: str, x: np.ndarray, y: np.ndarray, **options) -> float:
    """One value of the measure called ``name`` between two ``(num_examples x hidden)`` arrays."""
    measure = get_measure(name)
    check_options(name, options, measure.options)
    return float(measure.pair(x, y, **options))


def similarity_matrix(
    name: str, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray] | None = None, **options
) -> np.ndarray:
    """All-pairs matrix of the measure called ``name``: entry [i, j] = measure(xs[i], ys[j]).

    Parameters
    ----------
    name : a key of :data:`MEASURES`.
    xs : sequence of ``(num_examples x hidden_i)`` arrays (same examples, widths may differ).
    ys : the same, or None to compare ``xs`` with itself.
    **options : the measure's options (``Measure.options``), e.g. ``variance_threshold=0.95`` for
        svcca, ``method="gram"`` for linear_cka.

    Returns
    -------
    float64 array of shape ``(len(xs), len(ys))`` (``len(xs)`` squared for ys=None).

    Raises
    ------
    LayersimError
        For an unknown name or option (listing the valid ones) and the measure's own input errors.
    """
    measure = get_measure(name)
    check_options(name, options, measure.options)
    return measure.matrix(xs, ys, **options)
