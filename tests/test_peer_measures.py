"""The peers' measures in the registry: Procrustes and the shape metric (layersim.similarity.shape), RSA
(layersim.similarity.rsa) and k-NN Jaccard (layersim.similarity.neighbours). Small hand-computed cases, their
invariances, the streamed route, the null engines against the pair functions, and the size refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes

from layersim.errors import LayersimError
from layersim.params import parse_params
from layersim.similarity import (LayerMoments, check_computable, permutation_test, similarity, similarity_matrix)
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.results import settings
from layersim.similarity.shape import (angular_shape_distance, procrustes_distance, shape_matrix,
                                       shape_moments_matrix)

NEW = ("procrustes", "shape_metric", "rsa", "knn_jaccard")


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _rotation(rng, d):
    return np.linalg.qr(rng.normal(size=(d, d)))[0]


def test_procrustes_by_hand():
    x = np.array([[1.0, 0], [-1, 0], [0, 1], [0, -1]])
    y = np.array([[1.0, 0], [-1, 0], [0, 2], [0, -2]])
    # Centred already; Xᵀ Y = diag(2, 4), ‖X‖ = 2, ‖Y‖ = √10: s = 6 / (2 √10).
    assert similarity("procrustes", x, y) == pytest.approx(3 / np.sqrt(10), abs=1e-15)
    # Whitened fully both are the same shape (Y's axes rescaled): s = 1.
    assert similarity("shape_metric", x, y, alpha=0.0) == pytest.approx(1.0, abs=1e-12)
    line = np.array([[-1.0], [0], [1]])
    assert similarity("procrustes", line, -line) == pytest.approx(1.0, abs=1e-15)  # a reflection is orthogonal
    assert similarity("procrustes", line, np.array([[-1.0], [2], [-1]])) == pytest.approx(0.0, abs=1e-15)


def test_the_distances_are_the_procrustes_problem_solved(rng):
    """sqrt(2 − 2 s) is min over orthogonal Q of ‖X̃ − Ỹ Q‖ (scipy solves it), arccos s the angle."""
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(30, 5))
    xt, yt = (a - a.mean(0) for a in (x, y))
    xt, yt = xt / np.linalg.norm(xt), yt / np.linalg.norm(yt)
    q, _ = orthogonal_procrustes(yt, xt)
    assert procrustes_distance(x, y) == pytest.approx(np.linalg.norm(xt - yt @ q), abs=1e-12)
    assert angular_shape_distance(x, y) == pytest.approx(np.arccos(np.sum(xt * (yt @ q))), abs=1e-12)
    assert procrustes_distance(x, x) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("measure, options", [("procrustes", {}), ("shape_metric", {"alpha": 0.0}),
                                              ("shape_metric", {"alpha": 0.4}), ("rsa", {"rdm": "euclidean"}),
                                              ("rsa", {"compare": "pearson", "rdm": "euclidean"}),
                                              ("knn_jaccard", {"metric": "euclidean", "k": 5})])
def test_rotation_scaling_and_translation_change_nothing(measure, options, rng):
    x = rng.normal(size=(40, 6))
    # netrep's partial whitening (0 < alpha < 1) is at the data's own scale: there a scale moves it (next test).
    scale = 1.0 if 0 < options.get("alpha", 1.0) < 1 else 3.5
    moved = scale * x @ _rotation(rng, 6) + rng.normal(size=6)
    assert similarity(measure, x, moved, **options) == pytest.approx(1.0, abs=1e-9)
    assert similarity(measure, x, x, **options) == pytest.approx(1.0, abs=1e-12)
    other = rng.normal(size=(40, 3))
    assert similarity(measure, x, other, **options) == pytest.approx(similarity(measure, moved, other, **options),
                                                                     abs=1e-9)


def test_what_the_correlation_rdm_is_invariant_to(rng):
    """The correlation RDM sees each example's row centred and scaled across neurons: a scale and an offset per
    example change nothing; the cosine neighbours are taken after centring the columns, so they do move."""
    x = rng.normal(size=(40, 6))
    moved = x * rng.uniform(0.5, 3, size=(40, 1)) + rng.normal(size=(40, 1))
    assert similarity("rsa", x, moved) == pytest.approx(1.0, abs=1e-12)
    assert similarity("knn_jaccard", x, moved) < 0.99


def test_rsa_by_hand():
    x, y = np.array([[0.0], [1], [3]]), np.array([[0.0], [2], [3]])
    # Squared distances (pairs 01, 02, 12): x (1, 9, 4), y (4, 9, 1); ranks (1, 3, 2) and (2, 3, 1).
    assert similarity("rsa", x, y, rdm="euclidean") == pytest.approx(0.5, abs=1e-15)
    assert similarity("rsa", x, y, rdm="euclidean", compare="cosine") == pytest.approx(89 / 98, abs=1e-15)
    assert similarity("rsa", x, y, rdm="euclidean", compare="pearson") == pytest.approx(
        np.corrcoef([1, 9, 4], [4, 9, 1])[0, 1], abs=1e-15)


def test_knn_jaccard_by_hand():
    x = np.array([[0.0], [1], [2], [10], [11], [12]])
    y = np.array([[0.0], [1], [6], [10], [11], [12]])
    # k = 2: only example 2 changes neighbours, {0, 1} → {1, 3}: Jaccard 1/3, the others 1.
    assert similarity("knn_jaccard", x, y, k=2, metric="euclidean") == pytest.approx((5 + 1 / 3) / 6, abs=1e-15)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_the_streamed_route_equals_the_rows(alpha, rng):
    layers = [rng.normal(size=(50, 4)), rng.normal(size=(50, 6)) @ rng.normal(size=(6, 6)), rng.normal(size=(50, 3))]
    layers[1][:, :2] += layers[0][:, :2]
    streamed = shape_moments_matrix(LayerMoments.of_layers(layers, batch_rows=16), [0, 1, 2], alpha=alpha)
    np.testing.assert_allclose(streamed, shape_matrix(layers, alpha=alpha), atol=1e-9)


@pytest.mark.parametrize("measure", NEW)
def test_the_null_engine_is_the_measure_on_permuted_rows(measure, rng):
    x, y = rng.normal(size=(30, 4)), rng.normal(size=(30, 5))
    y[:, :3] += x[:, :3]
    perm = rng.permutation(30)
    engine = ENGINES[measure]([("x", x)], [("y", y)], np.ones((1, 1), bool))
    assert engine.values(perm)[0, 0] == pytest.approx(similarity(measure, x, y[perm]), abs=1e-12)
    assert engine.values(None)[0, 0] == pytest.approx(similarity(measure, x, y), abs=1e-12)
    value = engine.values(None)[0, 0]
    np.testing.assert_allclose(similarity_matrix(measure, [x, y]), [[1, value], [value, 1]], atol=1e-12)
    null = permutation_test(measure, x, y, permutations=40)
    assert null.p_value == pytest.approx(1 / 41) and null.null_mean < null.observed


def test_rsa_refuses_rows_above_its_limit_before_allocating():
    with pytest.raises(LayersimError, match=r"^rsa on n = 50000 examples would hold an n x n dissimilarity matrix "
                                            r"per layer \(18\.6 GiB each\), above its limit of 5000 rows"):
        check_computable("rsa", 50_000, 768)
    with pytest.raises(LayersimError, match="above its limit of 5000 rows"):
        similarity("rsa", np.zeros((5001, 2)), np.zeros((5001, 2)))
    check_computable("knn_jaccard", 50_000, 768)  # neighbour lists only: n × k
    check_computable("procrustes", 50_000, 768)


@pytest.mark.parametrize("measure, options, message", [
    ("shape_metric", {"alpha": 1.5}, "alpha must be a number in [0, 1]"),
    ("rsa", {"rdm": "cosine"}, "unknown RDM distance 'cosine'; valid RDM distances are: correlation, euclidean."),
    ("rsa", {"compare": "kendall"}, "unknown RDM comparison 'kendall'; valid RDM comparisons are: cosine, pearson, "
                                    "spearman."),
    ("knn_jaccard", {"metric": "manhattan"}, "unknown k-NN metric 'manhattan'; valid k-NN metrics are: cosine, "
                                             "euclidean."),
    ("knn_jaccard", {"k": 19}, "k must be an integer from 1 to n − 2 = 18"),
])
def test_bad_options_are_one_sentence(measure, options, message, rng):
    with pytest.raises(LayersimError) as info:
        similarity(measure, rng.normal(size=(20, 3)), rng.normal(size=(20, 3)), **options)
    assert str(info.value).startswith(message)


def test_undefined_inputs_are_named():
    rows = np.array([[1.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    with pytest.raises(LayersimError, match=r"^x has 1 example\(s\) whose row is the same in every neuron \(first: "
                                            r"row 0\)"):
        similarity("rsa", rows, rows)
    at_mean = np.array([[1.0, 0], [-1, 0], [0, 0], [0, 1], [0, -1]])
    with pytest.raises(LayersimError, match=r"^x has 1 example\(s\) at the layer's mean \(first: row 2\)"):
        similarity("knn_jaccard", at_mean, at_mean, k=2)


def test_the_params_keys_reach_the_measures():
    base = {"model": "tiny-bert", "tasks": ["rte"], "seeds": [1], "finetune": {"max_length": 32}}
    params = parse_params(base | {"similarity": {"shape_alpha": 0.25, "rsa_rdm": "euclidean", "rsa_compare": "cosine",
                                                 "knn_k": 7, "knn_metric": "euclidean"}})
    options, _ = settings(params.similarity)
    assert options["shape_metric"] == {"alpha": 0.25}
    assert options["rsa"] == {"rdm": "euclidean", "compare": "cosine"}
    assert options["knn_jaccard"] == {"k": 7, "metric": "euclidean"}
    with pytest.raises(LayersimError, match="similarity.shape_alpha"):
        parse_params(base | {"similarity": {"shape_alpha": 2}})
