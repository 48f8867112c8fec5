"""Tests for linear CKA (layersim.similarity.cka).

The numbers are checked against a plain ``tr(K H L H)`` formula written here from Phang et al.
2021, Appendix A, and against values worked out by hand; the invariances CKA is known for are
checked, and so is one it does not have (arbitrary invertible linear maps).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import cka, cka_matrix, linear_cka


def _reference_cka(x: np.ndarray, y: np.ndarray) -> float:
    """CKA straight from the definition: K = XXᵀ, H = I − 11ᵀ/n, HSIC = tr(KHLH)/(n−1)²."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T

    def hsic(a: np.ndarray, b: np.ndarray) -> float:
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))  # sign fix makes Q Haar-distributed; any Q would do


def _layers(rng: np.random.Generator, n: int, widths: list[int]) -> list[np.ndarray]:
    """Correlated 'layers': each a noisy linear map of the previous one, plus an offset."""
    layers = [rng.normal(size=(n, widths[0]))]
    for d in widths[1:]:
        prev = layers[-1]
        layers.append(prev @ rng.normal(size=(prev.shape[1], d)) + 0.7 * rng.normal(size=(n, d)) + 3.0)
    return layers


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# --- hand-computed values ---


def test_hand_computed_3x1():
    # x = [0, 1, 2] centres to [-1, 0, 1]; y = [0, 0, 1] centres to [-1/3, -1/3, 2/3].
    # With one column each, ||Ycᵀ Xc||² = (xc·yc)² = (1/3 + 0 + 2/3)² = 1,
    # ||Xcᵀ Xc|| = ||xc||² = 2, ||Ycᵀ Yc|| = ||yc||² = 1/9 + 1/9 + 4/9 = 2/3,
    # so CKA = 1 / (2 · 2/3) = 3/4 (the squared Pearson correlation).
    x = np.array([[0.0], [1.0], [2.0]])
    y = np.array([[0.0], [0.0], [1.0]])
    assert linear_cka(x, y) == pytest.approx(0.75, abs=1e-15)


def test_hand_computed_4x2_against_4x1():
    # X (already centred) = the four points ±e1, ±e2: Xᵀ X = 2·I₂, ||Xᵀ X||_F = 2√2.
    # y = [1, 0, -1, 0] (centred): yᵀ X = [2, 0], ||yᵀ X||² = 4, ||yᵀ y|| = 2.
    # CKA = 4 / (2√2 · 2) = 1/√2.
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    y = np.array([[1.0], [0.0], [-1.0], [0.0]])
    assert linear_cka(x, y) == pytest.approx(1 / np.sqrt(2), abs=1e-15)
    assert linear_cka(x + 5.0, y - 2.0) == pytest.approx(1 / np.sqrt(2), abs=1e-14)  # centring


# --- properties ---


def test_identical_inputs_give_one(rng):
    x = rng.normal(size=(50, 7))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, x.copy()) == pytest.approx(1.0, abs=1e-12)


def test_matches_plain_gram_formula(rng):
    for n, d1, d2 in [(40, 3, 9), (60, 25, 25), (30, 80, 5)]:  # n > d, n ~ d, n < d (gram path)
        x = rng.normal(size=(n, d1)) + rng.normal(size=d1)
        y = x[:, : min(d1, d2)] @ rng.normal(size=(min(d1, d2), d2)) + rng.normal(size=(n, d2))
        assert linear_cka(x, y) == pytest.approx(_reference_cka(x, y), abs=1e-12)


def test_invariant_to_orthogonal_transforms_scaling_and_translation(rng):
    x = rng.normal(size=(80, 6))
    y = x @ rng.normal(size=(6, 10)) + rng.normal(size=(80, 10))
    base = linear_cka(x, y)
    assert 0.1 < base < 0.99  # a value where a mistake could show
    q_x, q_y = _orthogonal(rng, 6), _orthogonal(rng, 10)
    assert linear_cka(x @ q_x, y @ q_y) == pytest.approx(base, abs=1e-12)
    assert linear_cka(3.7 * x, 0.02 * y) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x + 100.0, y - rng.normal(size=10)) == pytest.approx(base, abs=1e-10)


def test_not_invariant_to_ill_conditioned_invertible_map(rng):
    x = rng.normal(size=(500, 10))
    # Invertible (condition number 1e3), but stretches one direction so far that it dominates.
    a = _orthogonal(rng, 10) @ np.diag(np.logspace(0, 3, 10)) @ _orthogonal(rng, 10)
    assert np.linalg.matrix_rank(a) == 10
    assert linear_cka(x, x @ a) < 0.8


def test_symmetric_in_its_arguments(rng):
    x = rng.normal(size=(70, 4))
    y = np.tanh(x @ rng.normal(size=(4, 12))) + 0.5 * rng.normal(size=(70, 12))
    assert linear_cka(x, y) == pytest.approx(linear_cka(y, x), abs=1e-14)


def test_independent_data_with_many_examples_is_near_zero(rng):
    x = rng.normal(size=(4000, 5))
    y = rng.normal(size=(4000, 5))
    assert linear_cka(x, y) < 0.05


def test_float32_matches_float64(rng):
    x = rng.normal(size=(200, 16))
    y = x @ rng.normal(size=(16, 8)) + rng.normal(size=(200, 8))
    assert linear_cka(x.astype(np.float32), y.astype(np.float32)) == pytest.approx(linear_cka(x, y), abs=1e-6)


def test_float32_with_large_offset_is_computed_in_float64(rng):
    # Centring 1e4 + N(0, 1) in float32 would keep only ~3 digits of the signal.
    x32 = (1e4 + rng.normal(size=(300, 8))).astype(np.float32)
    y32 = (x32 - 1e4) @ rng.normal(size=(8, 8)).astype(np.float32) + 1e4
    assert linear_cka(x32, y32) == pytest.approx(
        linear_cka(x32.astype(np.float64), y32.astype(np.float64)), abs=1e-12
    )
    # The plain formula forms K = XXᵀ uncentred (entries ~1e8), so give it the shifted data;
    # subtracting 1e4 from float32 values is exact in float64 and CKA ignores translation.
    x64, y64 = x32.astype(np.float64) - 1e4, y32.astype(np.float64) - 1e4
    assert cka_matrix([x32, y32])[0, 1] == pytest.approx(_reference_cka(x64, y64), abs=1e-12)


def test_integer_input_is_accepted(rng):
    x = rng.integers(0, 5, size=(30, 3))
    y = rng.integers(0, 5, size=(30, 4))
    assert linear_cka(x, y) == pytest.approx(_reference_cka(x, y), abs=1e-12)


# --- all-pairs matrix ---


@pytest.mark.parametrize("method", ["auto", "gram", "feature"])
def test_matrix_entries_equal_pairwise_cka(rng, method):
    xs = _layers(rng, 45, [6, 6, 11, 3])
    ys = [layer.astype(np.float32) for layer in _layers(rng, 45, [8, 2, 5])]
    full = cka_matrix(xs, ys, method=method)
    assert full.shape == (4, 3)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            assert full[i, j] == pytest.approx(_reference_cka(x, y), abs=1e-10)


@pytest.mark.parametrize("n", [12, 300])  # fewer examples than widths, and more
def test_gram_and_feature_agree(rng, n):
    xs = _layers(rng, n, [20, 20, 35, 7, 20])
    ys = _layers(rng, n, [35, 9])
    for pair in ((xs, None), (xs, ys)):
        gram = cka_matrix(*pair, method="gram")
        feature = cka_matrix(*pair, method="feature")
        np.testing.assert_allclose(gram, feature, rtol=0, atol=1e-10)
        np.testing.assert_allclose(cka_matrix(*pair), feature, rtol=0, atol=1e-10)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            assert cka_matrix(xs, ys, method="gram")[i, j] == pytest.approx(linear_cka(x, y), abs=1e-10)


@pytest.mark.parametrize("method", ["gram", "feature"])
def test_symmetric_matrix(rng, method):
    xs = _layers(rng, 60, [10, 10, 4, 16, 10])
    m = cka_matrix(xs, method=method)
    assert m.shape == (5, 5)
    assert np.array_equal(m, m.T)  # exactly, not approximately
    assert np.all(np.diag(m) == 1.0)
    assert np.all((m >= 0) & (m <= 1))
    # The symmetric shortcut gives what the general path gives for ys = xs.
    np.testing.assert_allclose(m, cka_matrix(xs, list(xs), method=method), rtol=0, atol=1e-10)
    # Neighbouring layers of this chain are more alike than distant ones (the matrix is not trivial).
    assert m[0, 1] > m[0, 4]


@pytest.mark.parametrize("method", ["gram", "feature"])
def test_each_layer_is_centred_once(rng, method, monkeypatch):
    """Per-layer statistics are computed once, not once per pair."""
    calls = []

    def counting(original):
        def wrapper(name, a, *rest):
            calls.append(name)
            return original(name, a, *rest)

        return wrapper

    # The gram method centres with centre, the feature method into its stack with centre_into.
    from layersim.similarity import _cka_kernels

    monkeypatch.setattr(_cka_kernels, "centre", counting(_cka_kernels.centre))
    monkeypatch.setattr(_cka_kernels, "centre_into", counting(_cka_kernels.centre_into))
    xs = _layers(rng, 20, [5, 5, 5, 5])
    cka_matrix(xs, method=method)
    assert sorted(calls) == ["xs[0]", "xs[1]", "xs[2]", "xs[3]"]
    calls.clear()
    cka_matrix(xs, xs[:3], method=method)
    assert len(calls) == 7


def test_auto_rule():
    # Few examples, wide layers (e.g. RTE's 277 validation examples, 13 x 768): gram is cheaper.
    assert cka._pick_method(277, [768] * 13, None) == "gram"
    assert cka._pick_method(277, [768] * 13, [768] * 13) == "gram"
    # Many examples, narrow layers: feature space is cheaper.
    assert cka._pick_method(4000, [5, 5], None) == "feature"
    # Gram would be cheaper in arithmetic (n < d) but 13 Grams of 20000² float64 exceed 1 GiB.
    assert cka._pick_method(20_000, [50_000] * 13, None) == "feature"


def test_accepts_a_stacked_3d_array(rng):
    stacked = rng.normal(size=(3, 25, 4))
    np.testing.assert_allclose(cka_matrix(stacked), cka_matrix(list(stacked)), rtol=0, atol=0)


# --- errors ---


def _raises(fn, *args, message: str, **kwargs) -> str:
    with pytest.raises(LayersimError, match=re.escape(message)) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_errors_for_bad_shapes(rng):
    good = rng.normal(size=(10, 3))
    _raises(linear_cka, np.ones(10), good, message="x must be a 2-D (num_examples x hidden) array, got shape (10,)")
    _raises(cka_matrix, [good, np.ones((10, 3, 2))], message="xs[1] must be a 2-D")
    text = _raises(linear_cka, good, rng.normal(size=(12, 3)), message="y has shape (12, 3)")
    assert "(10, 3)" in text
    text = _raises(cka_matrix, [good], [good, rng.normal(size=(9, 3))], message="ys[1] has shape (9, 3)")
    assert "xs[0] has shape (10, 3)" in text
    _raises(linear_cka, np.ones((1, 4)), np.ones((1, 2)), message="x has shape (1, 4); CKA needs at least 2 rows")
    _raises(cka_matrix, good, message="got a single array of shape (10, 3)")
    _raises(linear_cka, np.array([["a"], ["b"]]), good[:2], message="x must hold real numbers, got dtype <U1")


def test_errors_for_non_finite_values(rng):
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 2))
    y[4, 1] = np.nan
    _raises(linear_cka, x, y, message="y contains 1 non-finite value (NaN or inf)")
    x32 = x.astype(np.float32)
    x32[0, 0] = x32[1, 2] = np.inf
    _raises(cka_matrix, [x, x32], message="xs[1] contains 2 non-finite values")


def test_errors_for_unknown_method_and_empty_lists(rng):
    text = _raises(cka_matrix, [rng.normal(size=(5, 2))], method="cosine", message="'cosine'")
    assert "auto, feature, gram" in text
    _raises(cka_matrix, [], message="xs is empty")
    _raises(cka_matrix, [rng.normal(size=(5, 2))], [], message="ys is empty")


@pytest.mark.parametrize("method", ["auto", "gram", "feature"])
def test_errors_for_constant_representations(rng, method):
    varied = rng.normal(size=(13, 3))
    # The mean of 13 copies of 1234.567 is not exactly 1234.567 in floating point, so centring
    # leaves ~1e-13 of rounding: that must still count as constant, not as a direction.
    constant = np.tile([1234.567, 0.1, -7.0], (13, 1))
    assert np.any(constant - constant.mean(axis=0) != 0)
    _raises(cka_matrix, [varied, constant, varied], method=method, message="xs[1] is constant across examples")
    _raises(cka_matrix, [varied], [varied, np.zeros((13, 0))], method=method, message="ys[1] is constant")
    _raises(linear_cka, varied, np.zeros((13, 2)), message="y is constant across examples")
    _raises(linear_cka, constant.astype(np.float32), varied, message="x is constant across examples")


# --- precision of the products ---


@pytest.mark.parametrize("method", ["gram", "feature"])
def test_float32_products_agree_with_float64(rng, method):
    # Layers with an offset (centring is float64 whatever the products' precision).
    xs = [layer.astype(np.float32) for layer in _layers(rng, 2700, [30, 30, 50, 7])]
    ys = [layer.astype(np.float32) for layer in _layers(rng, 2700, [12, 40])]
    for pair in ((xs, None), (xs, ys)):
        exact = cka_matrix(*pair, method=method, precision="float64")
        fast = cka_matrix(*pair, method=method, precision="float32")
        np.testing.assert_allclose(fast, exact, rtol=0, atol=1e-6)
        assert np.abs(fast - exact).max() > 0  # it really took the float32 path


def test_float32_products_cross_row_blocks_and_panels(rng, monkeypatch):
    # Several row blocks and several panels: each panel's reused float64 buffer is written by its first
    # block and added to by the rest, so a stale value or a lost block would show here.
    monkeypatch.setattr(cka, "BLOCK_ROWS", 100)
    monkeypatch.setattr(cka, "PANEL_COLUMNS", 16)
    xs = [layer.astype(np.float32) for layer in _layers(rng, 1000, [9, 20, 5, 11])]
    ys = [layer.astype(np.float32) for layer in _layers(rng, 1000, [7, 13])]
    for pair in ((xs, None), (xs, ys)):
        np.testing.assert_allclose(cka_matrix(*pair, method="feature", precision="float32"),
                                   cka_matrix(*pair, method="feature", precision="float64"), rtol=0, atol=1e-6)


def test_auto_precision_rule():
    small, big = np.zeros((10, 3), np.float32), 2.0**40
    assert cka._product_dtype("auto", [small, small], big) == np.float32
    assert cka._product_dtype("auto", [small, small], 1e6) == np.float64  # small products: keep the digits
    assert cka._product_dtype("auto", [small, small.astype(np.float64)], big) == np.float64  # float64 input
    assert cka._product_dtype("auto", [small.astype(np.int32)], big) == np.float64  # integers
    assert cka._product_dtype("float32", [small.astype(np.float64)], 1.0) == np.float32


def test_float32_products_still_reject_constant_layers(rng):
    constant = np.tile(np.float32([1234.567, 0.1, -7.0]), (40, 1))
    varied = rng.normal(size=(40, 3)).astype(np.float32)
    for method in ("gram", "feature"):
        _raises(cka_matrix, [varied, constant], method=method, precision="float32",
                message="xs[1] is constant across examples")


def test_errors_for_unknown_precision(rng):
    text = _raises(cka_matrix, [rng.normal(size=(5, 2))], precision="half", message="unknown precision 'half'")
    assert "auto, float32, float64" in text


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_centre_into_equals_centre_over_several_blocks(rng, monkeypatch, dtype):
    """Centring a block of rows at a time into a stack slice gives exactly centre()'s values, rounded."""
    from layersim.similarity import _common

    monkeypatch.setattr(_common, "CENTRE_BLOCK_BYTES", 8 * 3 * 7)  # 7 rows of width 3: 6 blocks for 40 rows
    a = (rng.normal(size=(40, 3)) * 1e-3 + 1e4).astype(np.float32)  # a large mean: float32 centring would lose it
    stack = np.full((40, 5), np.nan, dtype=dtype)
    _common.centre_into("x", a, stack[:, 1:4], "CKA")
    np.testing.assert_array_equal(stack[:, 1:4], _common.centre("x", a, "CKA").astype(dtype))
    assert np.isnan(stack[:, [0, 4]]).all()  # nothing written outside the slice
    with pytest.raises(LayersimError, match="x is constant across examples"):
        _common.centre_into("x", np.tile(a[:1], (40, 1)), stack[:, 1:4], "CKA")
