"""Weight-space change of one matrix (layersim.similarity.weight_space): intruder dimensions of Shuttleworth et al.
on hand-built matrices whose answer is known, and the invariances the definition implies."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from layersim.similarity.weight_space import (THRESHOLD, TOP_K, best_cosines, count_intruders, matrix_change,
                                              update_rank)


def _orthonormal(rng, n, k):
    return np.linalg.qr(rng.standard_normal((n, k)))[0]


def _planted(rng, out=96, inner=64):
    """A tall W0 = U diag(s) V^T with a separated spectrum (10 down to 1, the top-k far apart from the rest), a
    unit u orthogonal to every column of U (so to all of W0's left singular vectors) and a unit v in the span of
    W0's bottom right singular vectors: then W = W0 + s u v^T keeps W0's top singular pairs exactly (W^T W =
    W0^T W0 + s^2 v v^T, and v is orthogonal to them) and adds one new top vector close to u."""
    basis = _orthonormal(rng, out, inner + 1)
    left, u = basis[:, :inner], basis[:, inner]
    right = _orthonormal(rng, inner, inner)
    spectrum = np.concatenate([np.linspace(10, 6, TOP_K), np.linspace(1, 0.1, inner - TOP_K)])
    w0 = left @ np.diag(spectrum) @ right.T
    v = right[:, TOP_K:] @ rng.standard_normal(inner - TOP_K)
    v /= np.linalg.norm(v)
    return w0, u, v, spectrum


def test_a_rank_one_update_orthogonal_to_the_pretrained_singular_vectors_is_exactly_one_intruder():
    w0, u, v, spectrum = _planted(np.random.default_rng(0))
    strength = 3 * spectrum[0]  # larger than W0's top singular value: the new direction ranks first
    w = w0 + strength * np.outer(u, v)
    change = matrix_change(w0, w)
    cosines = np.array(change.best_cosines)
    assert change.intruders == 1 == count_intruders(w0, w)
    assert cosines[0] < 0.05  # the new top vector is nearly u: at most bottom-spectrum leakage (1/30)
    np.testing.assert_allclose(cosines[1:], 1.0, atol=1e-9)  # W0's old top pairs, untouched
    assert change.finetuned_spectrum[0] == pytest.approx(np.sqrt(strength ** 2 + (w0 @ v) @ (w0 @ v)), rel=1e-3)
    np.testing.assert_allclose(change.finetuned_spectrum[1:], spectrum[:TOP_K - 1], rtol=1e-9)
    assert change.update_rank == 1
    assert change.relative_update_norm == pytest.approx(strength / np.linalg.norm(spectrum))


def test_the_same_update_below_the_top_k_is_no_intruder():
    """An intruder must rank among the top k: the same planted direction with a small singular value is not counted."""
    w0, u, v, _ = _planted(np.random.default_rng(1))
    assert count_intruders(w0, w0 + 0.5 * np.outer(u, v)) == 0


def test_a_scaled_matrix_has_no_intruder_and_a_rank_of_its_own():
    w0 = np.random.default_rng(2).standard_normal((48, 32))
    change = matrix_change(w0, 1.01 * w0)
    assert change.intruders == 0
    np.testing.assert_allclose(change.best_cosines, 1.0, atol=1e-9)
    np.testing.assert_allclose(change.finetuned_spectrum, 1.01 * np.array(change.pretrained_spectrum))
    assert change.relative_update_norm == pytest.approx(0.01)
    assert change.update_rank == 32  # 0.01 W0 is full rank


def test_an_unchanged_matrix_has_a_zero_update():
    w0 = np.random.default_rng(3).standard_normal((20, 30)).astype(np.float32)
    change = matrix_change(w0, w0.copy())
    assert (change.intruders, change.update_rank, change.relative_update_norm) == (0, 0, 0.0)


def test_a_float32_merged_low_rank_update_keeps_its_rank_despite_rounding():
    """W = fl32(W0 + B A) differs from W0 + B A everywhere by rounding; the floor of the stored dtype ignores that."""
    rng = np.random.default_rng(4)
    w0 = (0.05 * rng.standard_normal((64, 48))).astype(np.float32)
    b, a = 1e-3 * rng.standard_normal((64, 4)), rng.standard_normal((4, 48))
    merged = (w0 + (b @ a).astype(np.float32)).astype(np.float32)
    assert update_rank(w0, merged) == 4
    assert update_rank(w0, merged, eps=float(np.finfo(np.float64).eps)) > 4  # a float64 floor sees the float32 rounding as rank


_shapes = st.tuples(st.integers(4, 24), st.integers(4, 24))


@settings(max_examples=25, deadline=None)
@given(_shapes, st.integers(0, 2**31 - 1), st.floats(0.01, 3.0))
def test_invariant_under_orthogonal_maps_applied_to_both(shape, seed, size):
    """Q W R^T for orthogonal Q, R maps both matrices' singular vectors by Q (left) and R (right): cosines,
    counts, spectra, update norm and rank are unchanged."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(shape)
    w = w0 + size * rng.standard_normal((shape[0], 2)) @ rng.standard_normal((2, shape[1]))
    q, r = _orthonormal(rng, shape[0], shape[0]), _orthonormal(rng, shape[1], shape[1])
    # The products Q·W·Rᵀ round at about n·eps·‖W‖ themselves, above float64's own floor (eps·‖W‖_F, the stored
    # weights' rounding): the rank is read against a floor that covers the test's arithmetic, not the weights'.
    floor = 1e-12
    before, after = matrix_change(w0, w, eps=floor), matrix_change(q @ w0 @ r.T, q @ w @ r.T, eps=floor)
    assert after.update_rank == before.update_rank <= 2
    np.testing.assert_allclose(after.pretrained_spectrum, before.pretrained_spectrum, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(after.finetuned_spectrum, before.finetuned_spectrum, rtol=1e-9, atol=1e-9)
    assert after.relative_update_norm == pytest.approx(before.relative_update_norm, rel=1e-9)
    # Cosines move only where singular values (nearly) tie and the basis inside their space is arbitrary.
    np.testing.assert_allclose(after.best_cosines, before.best_cosines, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(_shapes, st.integers(0, 2**31 - 1), st.floats(0.1, 10.0))
def test_scale_free_and_bounded(shape, seed, scale):
    """Scaling both matrices changes no cosine; every best |cosine| is in [0, 1]; a smaller threshold counts fewer."""
    rng = np.random.default_rng(seed)
    w0, w = rng.standard_normal(shape), rng.standard_normal(shape)
    cosines = best_cosines(w0, w)
    assert len(cosines) == min(TOP_K, *shape) and np.all((cosines >= 0) & (cosines <= 1 + 1e-12))
    np.testing.assert_allclose(best_cosines(scale * w0, scale * w), cosines, atol=1e-9)
    assert count_intruders(w0, w, threshold=0.3) <= count_intruders(w0, w, threshold=THRESHOLD)
    assert count_intruders(w0, w0) == 0


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        matrix_change(np.zeros((3, 4)), np.zeros((4, 3)))
