"""The CCA measures' default dimension cap (``max_dims="auto"``): well-posed on wide layers with few
examples, unchanged where the rows support every dimension, and the public helpers around it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from layersim.errors import LayersimError
from layersim.similarity import cca, kept_dimensions, similarity, similarity_matrix

CCA_MEASURES = ("svcca", "pwcca", "mean_cca")


def _raises(fn, *args, message: str, **kwargs) -> str:
    with pytest.raises(LayersimError, match=re.escape(message)) as err:
        fn(*args, **kwargs)
    return str(err.value)


def _top_components(a: np.ndarray, k: int) -> np.ndarray:
    u, s, _ = np.linalg.svd(a - a.mean(0), full_matrices=False)
    return u[:, :k] * s[:k]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_independent_wide_layers_are_far_from_one(seed):
    # 277 examples of two independent 768-wide layers: uncapped CCA saturates (svcca 0.96, pwcca and
    # mean_cca 1.00); the default cap keeps 27 dimensions per side.
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(277, 768)), rng.normal(size=(277, 768))
    for name in CCA_MEASURES:
        value = similarity(name, x, y)
        assert 0.0 <= value <= 0.5, (name, value)
        assert similarity(name, y, x) <= 0.5
    assert similarity("pwcca", x, y, method="qr") <= 0.5
    assert similarity("mean_cca", x, y, method="qr") <= 0.5
    # The uncapped measures are still available and still degenerate.
    assert similarity("mean_cca", x, y, max_dims=None) > 0.99


@pytest.mark.parametrize("seed", [0, 1])
def test_invertible_map_of_a_narrow_layer_is_still_one(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2000, 64))
    y = x @ rng.normal(size=(64, 64))  # invertible with probability 1
    assert kept_dimensions(x, "mean_cca") == 64  # the cap (199) cuts nothing
    for name in CCA_MEASURES:
        assert similarity(name, x, y) >= 0.99
        assert similarity(name, y, x) >= 0.99


def test_dimension_cap_rule():
    assert cca.ROWS_PER_DIMENSION == 10
    assert [cca.dimension_cap(n) for n in (2, 10, 11, 12, 21, 277, 1000, 1001, 5000)] == [
        1, 1, 1, 1, 2, 27, 99, 100, 499]
    assert cca.dimension_cap(277, 5) == 5
    assert cca.dimension_cap(277, None) is None
    assert cca.dimension_cap(277, np.int64(7)) == 7


def test_kept_dimensions_per_measure_and_option(rng=np.random.default_rng(0)):
    x = rng.normal(size=(277, 768))
    for name in CCA_MEASURES:
        assert kept_dimensions(x, name) == 27
        assert kept_dimensions(x, name, max_dims=5) == 5
    assert kept_dimensions(x, "mean_cca", max_dims=None) == 276  # rank of the centred data
    assert kept_dimensions(x, "mean_cca", method="qr", max_dims=None) == 276
    assert kept_dimensions(x, "pwcca", method="qr") == 27
    # A variance cut below the cap wins: a layer with 3 strong and 60 faint directions.
    scales = np.r_[np.full(3, 100.0), np.full(60, 0.01)]
    spiky = rng.normal(size=(2000, 63)) * scales
    assert kept_dimensions(spiky, "svcca") == 3
    assert kept_dimensions(spiky, "pwcca") == 63
    assert kept_dimensions(spiky, "pwcca", variance_threshold=0.99) == 3
    assert kept_dimensions(spiky, "svcca", variance_threshold=1.0) == 63


def test_cap_is_cca_of_the_top_principal_components(rng=np.random.default_rng(1)):
    x = rng.normal(size=(120, 40)) * np.linspace(3, 0.5, 40)
    y = np.tanh(x[:, :20] @ rng.normal(size=(20, 30))) + rng.normal(size=(120, 30))
    k = 11  # dimension_cap(120)
    xk, yk = _top_components(x, k), _top_components(y, k)
    assert cca.mean_cca_r2(x, y) == pytest.approx(cca.mean_cca_r2(xk, yk, max_dims=None), abs=1e-10)
    assert cca.mean_cca_r2(x, y, method="qr") == pytest.approx(cca.mean_cca_r2(x, y), abs=1e-10)
    assert cca.pwcca(x, y, method="qr") == pytest.approx(cca.pwcca(x, y), abs=1e-10)
    assert cca.svcca(x, y, variance_threshold=1.0) == pytest.approx(
        cca.canonical_correlations(xk, yk).mean(), abs=1e-10)
    np.testing.assert_allclose(cca.canonical_correlations(x, y, max_dims="auto"),
                               cca.canonical_correlations(xk, yk), atol=1e-10)


@pytest.mark.parametrize("name", CCA_MEASURES)
@pytest.mark.parametrize("max_dims", ["auto", 3, None])
def test_matrix_entries_equal_pairs_with_the_cap(name, max_dims):
    rng = np.random.default_rng(2)
    layers = [rng.normal(size=(60, w)) for w in (20, 8, 30)]
    layers[1] += layers[0][:, :8]
    matrix = similarity_matrix(name, layers, max_dims=max_dims)
    for i, a in enumerate(layers):
        for j, b in enumerate(layers):
            assert matrix[i, j] == pytest.approx(similarity(name, a, b, max_dims=max_dims), abs=1e-12)


@pytest.mark.parametrize("name", CCA_MEASURES)
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "all", "AUTO", [4]])
def test_bad_max_dims_is_an_error_naming_value_and_choices(name, bad):
    x = np.random.default_rng(3).normal(size=(30, 4))
    message = f"max_dims must be 'auto' (at most one dimension per 10 examples), None (no cap) or a positive integer, got {bad!r}."
    _raises(similarity, name, x, x, max_dims=bad, message=message)
    _raises(similarity_matrix, name, [x], max_dims=bad, message=message)
    _raises(kept_dimensions, x, name, max_dims=bad, message=message)
    _raises(cca.canonical_correlations, x, x, max_dims=bad, message=message)


def test_kept_dimensions_errors():
    x = np.random.default_rng(4).normal(size=(30, 4))
    _raises(kept_dimensions, x, "linear_cka",
            message="unknown CCA measure 'linear_cka'; valid CCA measures are: mean_cca, pwcca, svcca")
    _raises(kept_dimensions, x, "svcca", method="qr",
            message="unknown option 'method' for similarity measure 'svcca'; valid options are: max_dims, rtol, "
                    "variance_threshold.")
    _raises(kept_dimensions, x, "pwcca", method="qr", variance_threshold=0.9, message="method='qr' cannot apply")
    _raises(kept_dimensions, np.ones((30, 4)), "mean_cca", message="x is constant across examples")


def _count_svds(monkeypatch) -> list:
    calls = []
    real = cca._principal_directions

    def counted(centred):
        calls.append(centred.shape)
        return real(centred)

    monkeypatch.setattr("layersim.similarity._cca_core._principal_directions", counted)
    return calls


@pytest.mark.parametrize("measure", CCA_MEASURES)
def test_bases_reused_whitens_each_layer_once_and_changes_no_number(measure, monkeypatch):
    from layersim.similarity.inference.bootstrap import bootstrap_pairs
    from layersim.similarity.inference.null import permutation_matrix

    rng = np.random.default_rng(3)
    layers = [rng.normal(size=(80, 12)) @ rng.normal(size=(12, 12)) for _ in range(3)]

    def everything():
        return (similarity_matrix(measure, layers), permutation_matrix(measure, layers, permutations=7).p_value,
                [kept_dimensions(a, measure) for a in layers],
                bootstrap_pairs(measure, layers[:2], layers[1:], resamples=4).estimate)

    calls = _count_svds(monkeypatch)
    alone = everything()
    whitened_alone = len(calls)
    calls.clear()
    with cca.bases_reused():
        reused = everything()
        everything()
    # Alone: each of the 3 layers for the matrix, the null, its kept dimensions and the bootstrap estimate, plus the
    # 4 resamples' 3 layers; inside: each layer once, and the resamples (other arrays) again each time.
    resampled = 4 * 3
    assert whitened_alone == 4 * 3 + resampled
    assert len(calls) == 3 + 2 * resampled
    for a, b in zip(alone, reused):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bases_reused_tells_a_new_array_from_one_it_has_seen(monkeypatch):
    rng = np.random.default_rng(4)
    calls = _count_svds(monkeypatch)
    with cca.bases_reused():
        a = rng.normal(size=(50, 6))
        first = cca.whiten("a", a, "SVCCA", variance_threshold=0.99)
        assert cca.whiten("b", a, "SVCCA", variance_threshold=0.99).name == "b"  # the same basis, named as asked
        assert cca.whiten("a", a, "SVCCA", variance_threshold=0.5).q.shape[1] <= first.q.shape[1]  # other options
        assert len(calls) == 2
        del a  # a later array may take its address: it is whitened afresh
        for _ in range(3):
            b = rng.normal(size=(50, 6))
            np.testing.assert_array_equal(cca.whiten("b", b, "SVCCA", variance_threshold=0.99).q,
                                          cca.whiten("c", b.copy(), "SVCCA", variance_threshold=0.99).q)
    assert len(calls) == 2 + 3 * 2  # each b and its copy whitened afresh
