"""Similarity measures between layer representations: pure math on ``(num_examples x hidden)`` arrays.

The bottom layer of the library: NumPy only, no I/O, no models.
"""

from layersim.similarity.cka import cka_matrix, is_constant, linear_cka

__all__ = ["cka_matrix", "is_constant", "linear_cka"]
