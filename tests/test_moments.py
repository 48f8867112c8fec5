"""The CCA family, neuronsim and mixedsim from streamed second moments equal the in-memory measures."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import similarity_matrix
from layersim.similarity.cka_streaming import LinearCKAAccumulator
from layersim.similarity.moments import LayerMoments, moments_matrix

CASES = [("svcca", {"variance_threshold": 0.99}), ("svcca", {"variance_threshold": 0.9, "max_dims": 5}),
         ("pwcca", {"variance_threshold": None}), ("pwcca", {"variance_threshold": 0.99}),
         ("mean_cca", {}), ("neuronsim", {}), ("mixedsim", {})]


def _layers(seed: int, num: int, n: int = 500, d: int = 20, mean: float = 5.0) -> list[np.ndarray]:
    """Related float32 layers with a large mean (centring must not cancel digits), well conditioned."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, d))
    return [(np.tanh(base @ rng.standard_normal((d, d)) * 0.5 + 0.5 * rng.standard_normal((n, d))) + mean)
            .astype(np.float32) for _ in range(num)]


@pytest.mark.parametrize("name, options", CASES)
def test_moments_equal_the_in_memory_matrix(name, options):
    xs, ys = _layers(0, 4), _layers(1, 3)
    xs[1][:, 3] = 2.5  # a constant neuron: dropped on both routes
    moments = LayerMoments.of_layers(xs + ys, batch_rows=97)  # batches that do not divide the rows
    same = moments_matrix(name, moments, [0, 1, 2, 3], **options)
    np.testing.assert_allclose(same, similarity_matrix(name, xs, **options), rtol=0, atol=1e-9)
    cross = moments_matrix(name, moments, [0, 1, 2, 3], [4, 5, 6], **options)
    np.testing.assert_allclose(cross, similarity_matrix(name, xs, ys, **options), rtol=0, atol=1e-9)


def test_a_duplicated_neuron_loses_the_same_direction_on_both_routes():
    xs = _layers(2, 3)
    xs[2][:, 5] = xs[2][:, 4]  # exactly dependent: one direction fewer
    moments = LayerMoments.of_layers(xs)
    for name in ("mean_cca", "pwcca", "svcca"):
        options = {"variance_threshold": 0.99} if name == "svcca" else {}
        np.testing.assert_allclose(moments_matrix(name, moments, [0, 1, 2], **options),
                                   similarity_matrix(name, xs, **options), rtol=0, atol=1e-9)


def test_moments_from_row_batches_do_not_depend_on_the_batching():
    xs = _layers(3, 3, n=400)
    whole = LayerMoments.of_layers(xs, batch_rows=400)
    acc = LinearCKAAccumulator(precision="float64")
    for start, stop in ((0, 7), (7, 250), (250, 400)):
        acc.update([a[start:stop] for a in xs])
    for name, options in CASES:
        np.testing.assert_allclose(moments_matrix(name, LayerMoments(acc), [0, 1, 2], **options),
                                   moments_matrix(name, whole, [0, 1, 2], **options), rtol=0, atol=1e-10)


def test_bad_requests_are_refused_with_the_valid_choices():
    moments = LayerMoments.of_layers(_layers(4, 2, n=50))
    with pytest.raises(LayersimError, match="linear_cka.*valid|svcca, pwcca"):
        moments_matrix("linear_cka", moments, [0, 1])
    with pytest.raises(LayersimError, match="variance_threshold"):
        moments_matrix("svcca", moments, [0, 1])
    with pytest.raises(LayersimError, match="mixedsim cannot be computed"):
        moments_matrix("mixedsim", LayerMoments.of_layers(_layers(5, 2, n=15)), [0, 1])
    constant = [np.ones((30, 4), np.float32), _layers(6, 1, n=30, d=4)[0]]
    with pytest.raises(LayersimError, match="constant"):
        moments_matrix("neuronsim", LayerMoments.of_layers(constant), [0, 1])
