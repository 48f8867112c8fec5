"""Weight-space change of one matrix (layersim.similarity.weight_space): intruder dimensions of Shuttleworth et al.
on hand-built matrices whose answer is known, and the invariances the definition implies."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from layersim.similarity.weight_space import (THRESHOLD, TOP_K, best_cosines, count_intruders, haar_frame,
                                              matrix_change, null_p_value, rotated_update_counts, update_rank)


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


# --- the rotated-update null (rotated_update_counts) ---


def _gapped(rng, n=16, top=3):
    """A square W0 with `top` singular values near 3 and the rest at most 0.3, and its singular vectors."""
    x, y = haar_frame(rng, n, n), haar_frame(rng, n, n)
    spectrum = np.concatenate([np.linspace(3, 2.8, top), np.linspace(0.3, 0.05, n - top)])
    return (x * spectrum) @ y.T, x, y


def test_haar_frames_are_orthonormal_and_unbiased():
    rng = np.random.default_rng(0)
    frames = [haar_frame(rng, 12, 3) for _ in range(400)]
    for frame in frames[:5]:
        np.testing.assert_allclose(frame.T @ frame, np.eye(3), atol=1e-12)
    # Haar: E[Q Q^T] = (3 / 12) I, whatever the coordinates (a biased frame, e.g. one that favours the first
    # axes, fails this by far more than the sampling error of 400 draws, about 0.02 per entry).
    np.testing.assert_allclose(np.mean([f @ f.T for f in frames], axis=0), 0.25 * np.eye(12), atol=0.06)


def test_an_unchanged_matrix_has_a_null_of_zeros_and_p_one():
    w0 = np.random.default_rng(1).standard_normal((10, 14))
    change = matrix_change(w0, w0.copy(), k=3, null_draws=9, rng=np.random.default_rng(0))
    assert change.null_intruders == (0,) * 9 and change.null_mean == 0 and change.p_value == 1.0


def test_the_null_is_reproducible_from_its_generator_and_absent_without_draws():
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((12, 12))
    w = w0 + 2 * np.outer(rng.standard_normal(12), rng.standard_normal(12))
    first, again = (rotated_update_counts(w0, w, 3, 0.5, 20, np.random.default_rng(7)) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    change = matrix_change(w0, w, k=3)
    assert change.null_intruders == () and change.null_mean is None and change.p_value is None


def test_a_structureless_update_is_what_the_null_expects_and_its_p_value_is_not_small_too_often():
    """Updates drawn from the null itself (Haar singular vectors, fixed singular values) on W0s with a smooth
    spectrum: the null's expected count matches the counts found (within sampling error), and the p-values are
    valid, P(p ≤ α) ≤ α, up to 3 binomial standard errors over the 100 planted matrices; they also spread (the
    counts vary, so P(p ≤ 0.5) is far from 0). Fixed seeds: the numbers are the same on every run."""
    rng, n, values, planted = np.random.default_rng(0), 20, np.array([3.0, 2.5]), 100
    found, expected, p_values = [], [], []
    for i in range(planted):
        x, y = haar_frame(rng, n, n), haar_frame(rng, n, n)
        w0 = (x * np.linspace(3, 0.3, n)) @ y.T
        update = (haar_frame(rng, n, 2) * values) @ haar_frame(rng, n, 2).T
        change = matrix_change(w0, w0 + update, k=3, null_draws=19, rng=np.random.default_rng(1000 + i))
        found.append(change.intruders), expected.append(change.null_mean), p_values.append(change.p_value)
    found, p_values = np.array(found), np.array(p_values)
    assert 0.2 < found.mean() < 2  # intruders occur, and not in every slot
    assert abs(found.mean() - np.mean(expected)) < 3 * found.std() / np.sqrt(planted)
    for alpha in (0.1, 0.2, 0.5):
        assert np.mean(p_values <= alpha) <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / planted)
    assert np.mean(p_values <= 0.5) >= 0.1


def test_a_planted_intruder_direction_has_a_small_p_value():
    """W0 with a gapped spectrum; the update s u v^T with u, v spread evenly (|cos| = 1/√13 with each) over the
    singular vectors outside W0's top 3 and s within the top 3's range: u is a new top direction, an intruder. A
    random direction of the same size overlaps W0's top pairs and rarely is one, so the null expects about 0.01."""
    rng = np.random.default_rng(1)
    counts, nulls = [], []
    for i in range(5):
        w0, x, y = _gapped(rng)
        spread = lambda: np.linalg.qr(rng.choice([-1.0, 1.0], size=(13, 1)))[0]  # noqa: E731
        w = w0 + 2.85 * (x[:, 3:] @ spread()) @ (y[:, 3:] @ spread()).T
        change = matrix_change(w0, w, k=3, null_draws=99, rng=np.random.default_rng(i))
        assert change.intruders == 1 and change.null_mean < 0.1 and change.p_value < 0.1
        counts.append(change.intruders), nulls.append(change.null_intruders)
    # The five matrices together (one role over layers: draws summed index by index): p at its floor, 1/100.
    assert null_p_value(sum(counts), np.sum(nulls, axis=0)) == pytest.approx(1 / 100)


# --- the null drawn in W0's singular bases (rotated_null_cosines) against the definition ---


def _reference_null_cosines(w0, values, k, draws, rng):
    """The null as defined, written out: W0 + U' diag(s) V'^T with U', V' the Q factors (signs fixed by R's
    diagonal) of Gaussian matrices of the full out × r and in × r, its top-k left singular vectors by SVD, their best
    |cosines| with W0's left singular vectors."""
    def haar(dim, rank):
        q, r = np.linalg.qr(rng.standard_normal((dim, rank)))
        return q * np.sign(np.diag(r))

    pretrained_u = np.linalg.svd(w0, full_matrices=False)[0]
    out, inner = w0.shape
    found = []
    for _ in range(draws):
        left = np.linalg.svd(w0 + (haar(out, values.size) * values) @ haar(inner, values.size).T)[0][:, :k]
        found.append(np.abs(left.T @ pretrained_u).max(axis=1))
    return np.array(found)


# (out, in, rank): square at full and low rank; tall and wide with the long side's other rows at most the rank
# (the frame drawn whole) and beyond it (Bartlett's Wishart factor), at full and low rank.
_NULL_CASES = [(16, 16, 16), (16, 16, 4), (22, 14, 14), (36, 14, 14), (36, 14, 3), (14, 22, 14), (14, 36, 14),
               (14, 36, 3)]


@pytest.mark.parametrize("out, inner, rank", _NULL_CASES)
def test_the_null_drawn_in_the_singular_bases_has_the_definitions_distribution(out, inner, rank):
    """Each of the top 3 best cosines, over 600 draws, against 600 draws of the definition written out (a two-sample
    Kolmogorov-Smirnov test; fixed seeds, so the same numbers on every run), and the intruder counts' means within
    4 standard errors. The update is larger than W0's spectrum, so that 0.4 to 1.9 of the three are intruders."""
    from scipy.stats import ks_2samp

    from layersim.similarity.weight_space import rotated_null_cosines

    rng = np.random.default_rng(out * 100 + inner * 10 + rank)
    w0 = (haar_frame(rng, out, min(out, inner)) * np.linspace(2, 0.2, min(out, inner))) @ \
        haar_frame(rng, inner, min(out, inner)).T
    values = np.linspace(3, 0.75, rank)
    expected = _reference_null_cosines(w0, values, 3, 600, np.random.default_rng(1))
    drawn = rotated_null_cosines(np.linalg.svd(w0, compute_uv=False), values, (out, inner), 3, 600,
                                 np.random.default_rng(2))
    assert drawn.shape == (600, 3) and np.all((drawn > 0) & (drawn <= 1 + 1e-12))
    for column in range(3):
        assert ks_2samp(expected[:, column], drawn[:, column]).pvalue > 1e-3
    counts = [(cosines < THRESHOLD).sum(axis=1) for cosines in (expected, drawn)]
    assert 0.2 < counts[0].mean() < 2.8  # the case tests the count, not a floor of zeros or a ceiling of threes
    spread = np.sqrt((counts[0].var() + counts[1].var()) / 600)
    assert abs(counts[0].mean() - counts[1].mean()) < 4 * spread


@pytest.mark.parametrize("out, inner, rank", _NULL_CASES)
def test_in_the_limits_an_overwhelming_update_is_a_random_direction_and_a_tiny_one_none(out, inner, rank):
    """An update 10⁹ times W0 with distinct singular values: its top vectors are U's columns, Haar-random in the
    output space, and the best |cos| with W0's n = min(out, in) left singular vectors is the largest of a random
    unit vector's first n coordinates (Kolmogorov-Smirnov against such vectors drawn directly, 400 each). An update
    10⁻⁷ of W0's spectral gaps moves no top vector by more than 10⁻⁵."""
    from scipy.stats import ks_2samp

    from layersim.similarity.weight_space import rotated_null_cosines

    n, k = min(out, inner), min(3, rank)
    sigma = np.linspace(3, 0.5, n)
    large = rotated_null_cosines(1e-9 * sigma, np.linspace(3, 1, rank), (out, inner), k, 400,
                                 np.random.default_rng(0))
    directions = np.random.default_rng(1).standard_normal((400, out))
    expected = np.abs(directions[:, :n]).max(axis=1) / np.linalg.norm(directions, axis=1)
    for column in range(k):
        assert ks_2samp(large[:, column], expected).pvalue > 1e-3
    small = rotated_null_cosines(sigma, 1e-7 * np.linspace(1, 0.5, rank), (out, inner), 3, 20,
                                 np.random.default_rng(0))
    np.testing.assert_allclose(small, 1.0, atol=1e-5)


def test_the_long_frames_first_rows_are_those_of_a_haar_frame():
    """Bartlett's shortcut (_long_frame with more other rows than the rank): the first n rows F_n of a Haar (L, r)
    frame have E[F_n^T F_n] = (n / L) I, and each diagonal entry is Beta(n/2, (L − n)/2): variance
    2 n (L − n) / (L² (L + 2)). A chi-square off by one degree of freedom moves the mean by about 1/L."""
    from layersim.similarity.weight_space import _long_frame

    rng, n, long, rank, draws = np.random.default_rng(3), 5, 40, 3, 4000
    frames = np.array([_long_frame(rng, n, long, rank) for _ in range(draws)])
    assert frames.shape == (draws, n + rank, rank)
    np.testing.assert_allclose(frames.transpose(0, 2, 1) @ frames, np.broadcast_to(np.eye(rank), (draws, 3, 3)),
                               atol=1e-12)
    grams = frames[:, :n].transpose(0, 2, 1) @ frames[:, :n]
    diagonal = grams[:, np.arange(rank), np.arange(rank)].ravel()
    variance = 2 * n * (long - n) / (long ** 2 * (long + 2))
    assert abs(diagonal.mean() - n / long) < 4 * np.sqrt(variance / diagonal.size)
    assert abs(diagonal.var() / variance - 1) < 0.1
    off = grams[:, 0, 1]
    assert abs(off.mean()) < 4 * off.std() / np.sqrt(draws)
