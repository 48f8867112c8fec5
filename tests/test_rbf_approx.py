"""RBF CKA above exact_max_rows: the Nyström route, checked against the exact kernels."""

from __future__ import annotations

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import similarity_matrix
from layersim.similarity.kernels import NystromRBF


def _layers(n: int = 400, d: int = 16, num: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, d))
    return [(np.tanh(base @ rng.standard_normal((d, d)) * 0.4) + 0.3 * rng.standard_normal((n, d)) + 3.0)
            .astype(np.float32) for _ in range(num)]


def test_every_example_a_landmark_is_the_exact_kernel():
    """With all n examples as landmarks, Φ Φᵀ = K K⁺ K = K: the Nyström route gives the exact matrix."""
    layers = _layers()
    exact = similarity_matrix("rbf_cka", layers)
    nystrom = similarity_matrix("rbf_cka", layers, exact_max_rows=2, landmarks=400)
    np.testing.assert_allclose(nystrom, exact, rtol=0, atol=2e-6)  # float32 feature products


def test_fewer_landmarks_approximate_within_a_hundredth():
    layers = _layers(n=800)
    exact = similarity_matrix("rbf_cka", layers)
    approx = similarity_matrix("rbf_cka", layers, exact_max_rows=100, landmarks=150)
    assert np.abs(approx - exact).max() < 0.01
    cross = similarity_matrix("rbf_cka", layers[:2], layers[1:], exact_max_rows=100, landmarks=150)
    np.testing.assert_allclose(cross, approx[:2, 1:], rtol=0, atol=1e-6)


def test_the_bandwidth_rule_is_unchanged_and_sampled_above_a_million_pairs():
    layers = _layers(n=300)
    small = NystromRBF("x", layers[0], 1.0, 50, seed=0)
    a = layers[0].astype(np.float64)
    distances = np.sqrt(((a[:, None, :] - a[None, :, :]) ** 2).sum(-1))[np.triu_indices(300, 1)]
    assert small.median == pytest.approx(np.median(distances), rel=1e-12)
    big = _layers(n=1600, num=1)[0]  # 1.28 million pairs: the median over a sample of 1,414 rows
    b = big.astype(np.float64)
    gram = b @ b.T
    sq = np.diag(gram)[:, None] + np.diag(gram)[None, :] - 2 * gram
    exact = np.median(np.sqrt(np.maximum(sq[np.triu_indices(1600, 1)], 0)))
    assert NystromRBF("x", big, 1.0, 50, seed=0).median == pytest.approx(exact, rel=5e-3)


def test_the_approximation_is_seeded_and_options_are_checked():
    layers = _layers(n=200)
    first = similarity_matrix("rbf_cka", layers, exact_max_rows=10, landmarks=40, landmark_seed=3)
    np.testing.assert_array_equal(first, similarity_matrix("rbf_cka", layers, exact_max_rows=10, landmarks=40, landmark_seed=3))
    for key, bad in (("landmarks", 0), ("exact_max_rows", "all"), ("landmarks", True)):
        with pytest.raises(LayersimError, match=f"{key} must be an integer of at least 2"):
            similarity_matrix("rbf_cka", layers, **{key: bad})


def test_the_streamed_sums_equal_cka_of_the_corrected_kernels():
    """The one-pass terms give exactly CKA of K̃ = Φ Φᵀ + diag(1 - ‖φ_i‖²) built densely, whose diagonal
    is the RBF kernel's (1); several row blocks (n > 4,096) exercise the streaming."""
    layers = _layers(n=4500, d=8, num=2, seed=4)
    got = similarity_matrix("rbf_cka", layers, exact_max_rows=100, landmarks=20, landmark_seed=2)
    n = layers[0].shape[0]
    kernels = []
    for a in layers:
        phi = NystromRBF("x", a, 1.0, 20, seed=2).features(a)
        kernel = phi @ phi.T
        kernel[np.diag_indices(n)] = 1.0
        # H K H with H = I - 11ᵀ/n, by its row, column and grand means (two dense n³ products otherwise)
        kernels.append(kernel - kernel.mean(0, keepdims=True) - kernel.mean(1, keepdims=True) + kernel.mean())
    dense = np.sum(kernels[0] * kernels[1]) / np.sqrt(np.sum(kernels[0] ** 2) * np.sum(kernels[1] ** 2))
    assert got[0, 1] == pytest.approx(dense, abs=2e-6)  # float32 feature products
    assert got[0, 1] != pytest.approx(
        similarity_matrix("rbf_cka", layers, exact_max_rows=100, landmarks=20, landmark_seed=3)[0, 1], abs=1e-6)
