"""Maps between representation spaces (Ren et al. 2023, "All Roads Lead to Rome?"): fit ``g`` with
``g(X) ≈ Y`` on paired training rows of two representations, score it on held-out rows.

Pure math on ``(num_examples x hidden)`` arrays (NumPy and torch), no I/O. Maps, by registry name:
``linear`` (least squares), ``cca``, ``svcca``, ``pwcca`` (Ren eq. 6 and its variants), ``inn``
(a RealNVP invertible network) and ``mlp`` (a non-invertible network); each has
``fit(x_train, y_train)``, ``transform(x)`` and, where it exists, ``inverse(y)``.
"""

from layersim.align.base import AlignmentMap, fit_maps
from layersim.compute.linalg import Standardizer
from layersim.align.experiments import alignment_errors, layer_alignment_matrix, map_representations, synthetic_recovery
from layersim.align.linear import CCAMap, LinearRegressionMap, PWCCAMap, SVCCAMap
from layersim.align.maps import MAPS, make_map
from layersim.align.metrics import mse, relative_error, train_test_split_rows
from layersim.align.flows import CouplingFlow, random_flow
from layersim.align.neural import INNMap, MLPMap

__all__ = [
    "MAPS", "AlignmentMap", "CCAMap", "CouplingFlow", "INNMap", "LinearRegressionMap", "MLPMap", "PWCCAMap",
    "SVCCAMap", "Standardizer", "alignment_errors", "fit_maps", "layer_alignment_matrix", "make_map", "map_representations",
    "mse", "random_flow", "relative_error", "synthetic_recovery", "train_test_split_rows",
]
