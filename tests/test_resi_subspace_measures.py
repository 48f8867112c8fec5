"""ReSi's subspace, alignment, matching and summary measures in the registry (layersim.similarity.subspaces, .aligned,
.matching, .summaries) against slow references written here from their papers' formulas, with loops and
general-purpose solvers only (no layersim code):
least squares with an explicit intercept column, scipy's orthogonal Procrustes on zero-padded data, brute force over
every matching, covariance-matrix inverses, projection matrices from pseudo-inverses, double loops over examples.
Also: the distances recovered from the similarities, small exact cases, the size refusals, block-permutation nulls,
and the relations the docstrings state (GULP at ridge 0 and CCA, soft = hard at equal widths, soft ≤ neuronsim)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes

from layersim.errors import LayersimError
from layersim.similarity import (MEASURES, canonical_correlations, check_computable, neuronsim, permutation_matrix,
                                 similarity, similarity_matrix)
from layersim.similarity.aligned import size_and_shape_distance
from layersim.similarity.matching import soft_matching_distance
from layersim.similarity.subspaces import gulp_distance
from layersim.similarity.summaries import summary_difference

TOL = 1e-9  # every reference agrees to rounding (float64; the forced LP route to its solver's tolerance: SOFT_TOL)
SOFT_TOL = 1e-7


@pytest.fixture
def rng():
    return np.random.default_rng(65)


def _related(rng, n=50, dx=5, dy=4, offset=1.5):
    """Two related layers with offsets and unequal neuron scales (full rank, n well above the widths)."""
    x = rng.normal(size=(n, dx)) * rng.uniform(0.5, 2.0, size=dx) + offset
    y = np.tanh(x @ rng.normal(size=(dx, dy)) / 2) + 0.6 * rng.normal(size=(n, dy)) - offset
    return x, y


def _centred(a):
    return a - a.mean(axis=0)


def _pad(a, width):
    return np.hstack([a, np.zeros((a.shape[0], width - a.shape[1]))])


# --- references, from the papers' formulas ---


def _ref_linear_regression(x, y):
    """R² of predicting every neuron of x from y by least squares with an intercept column (Kornblith et al.)."""
    design = np.column_stack([np.ones(len(y)), y])
    residual, total = 0.0, 0.0
    for k in range(x.shape[1]):
        coef, *_ = np.linalg.lstsq(design, x[:, k], rcond=None)
        residual += np.sum((x[:, k] - design @ coef) ** 2)
        total += np.sum((x[:, k] - x[:, k].mean()) ** 2)
    return 1.0 - residual / total


def _ref_size_and_shape_distance(x, y):
    """min over orthogonal Q of ‖Xc Q − Yc‖ (scipy solves it), the narrower side zero-padded (ReSi, Williams)."""
    width = max(x.shape[1], y.shape[1])
    xc, yc = _pad(_centred(x), width), _pad(_centred(y), width)
    q, _ = orthogonal_procrustes(xc, yc)
    return float(np.linalg.norm(xc @ q - yc))


def _ref_size_and_shape(x, y):
    d = _ref_size_and_shape_distance(x, y)
    return 1.0 - d**2 / (np.sum(_centred(x) ** 2) + np.sum(_centred(y) ** 2))


def _ref_aligned_cosine(x, y):
    """Hamilton et al.: rotate x onto y (orthogonal Procrustes, zero-padded), then the mean cosine row by row."""
    width = max(x.shape[1], y.shape[1])
    xp, yp = _pad(x, width), _pad(y, width)
    q, _ = orthogonal_procrustes(xp, yp)
    total = 0.0
    for r, s in zip(xp @ q, yp):
        total += r @ s / (math.sqrt(r @ r) * math.sqrt(s @ s))
    return total / len(x)


def _pearson(a, b):
    a, b = a - a.mean(), b - b.mean()
    return float(a @ b / math.sqrt((a @ a) * (b @ b)))


def _correlation_table(x, y):
    return [[_pearson(x[:, k], y[:, l]) for l in range(y.shape[1])] for k in range(x.shape[1])]


def _ref_hard_match(x, y):
    """Li et al. 2015: the best one-to-one matching, by trying every injective assignment of the narrower side."""
    r = _correlation_table(x, y)
    dx, dy = len(r), len(r[0])
    if dx <= dy:
        return max(sum(r[k][l] for k, l in enumerate(chosen)) for chosen in itertools.permutations(range(dy), dx)) / dx
    return max(sum(r[k][l] for l, k in enumerate(chosen)) for chosen in itertools.permutations(range(dx), dy)) / dy


def _ref_soft_match(x, y):
    """Khosla & Williams 2023's transport (row sums 1/dx, column sums 1/dy) by brute force: each neuron of x copied
    dy/g times and each of y dx/g times (g = gcd) makes the plan a doubly stochastic L × L matrix (L = lcm), whose
    optimum is a permutation (Birkhoff–von Neumann); the best permutation by trying all of them."""
    r = _correlation_table(x, y)
    dx, dy = len(r), len(r[0])
    size = dx * dy // math.gcd(dx, dy)
    rows = [k for k in range(dx) for _ in range(size // dx)]
    cols = [l for l in range(dy) for _ in range(size // dy)]
    return max(sum(r[rows[a]][cols[b]] for a, b in enumerate(chosen))
               for chosen in itertools.permutations(range(size))) / size


def _ref_gulp_distance(x, y, ridge):
    """Boix-Adserà et al.'s d²_λ from covariances: each layer centred, scaled to a trace-1 covariance Σ = XᵀX/n
    (their normalisation), then tr(Σx Σx^λ⁻¹ Σx Σx^λ⁻¹) + (the same for y) − 2 tr(Σx^λ⁻¹ Σxy Σy^λ⁻¹ Σyx)."""
    n = len(x)
    xs = [_centred(a) * math.sqrt(n) / np.linalg.norm(_centred(a)) for a in (x, y)]
    (a, b) = xs
    sxx, syy, sxy = a.T @ a / n, b.T @ b / n, a.T @ b / n
    ix, iy = np.linalg.inv(sxx + ridge * np.eye(len(sxx))), np.linalg.inv(syy + ridge * np.eye(len(syy)))
    t1 = np.trace(sxx @ ix @ sxx @ ix)
    t2 = np.trace(syy @ iy @ syy @ iy)
    t3 = np.trace(ix @ sxy @ iy @ sxy.T)
    return t1 + t2 - 2 * t3, t1 + t2


def _ref_gulp(x, y, ridge):
    d2, total = _ref_gulp_distance(x, y, ridge)
    return 1.0 - d2 / total


def _ref_eigenspace_overlap(x, y):
    """May et al.: ‖UᵀV‖²_F / max(rank), U, V bases of the (centred) column spans, via the projections X X⁺."""
    px, py = (_centred(a) @ np.linalg.pinv(_centred(a)) for a in (x, y))
    rx, ry = (np.linalg.matrix_rank(_centred(a)) for a in (x, y))
    return float(np.trace(px @ py)) / max(rx, ry)


def _ref_magnitude(a):
    mean = [sum(a[i, k] for i in range(len(a))) / len(a) for k in range(a.shape[1])]
    return math.sqrt(sum(m * m for m in mean))


def _ref_concentricity(a):
    mean = a.mean(axis=0)
    return sum(row @ mean / (math.sqrt(row @ row) * math.sqrt(mean @ mean)) for row in a) / len(a)


def _ref_uniformity(a, t=2.0):
    total = 0.0
    for i in range(len(a)):
        for j in range(len(a)):
            total += math.exp(-t * float(np.sum((a[i] - a[j]) ** 2)))
    return math.log(total / len(a) ** 2)


def _difference(summary):
    return lambda x, y: 1.0 / (1.0 + abs(summary(x) - summary(y)))


REFERENCES = {
    "linear_regression": (_ref_linear_regression, TOL),
    "size_and_shape": (_ref_size_and_shape, TOL),
    "aligned_cosine": (_ref_aligned_cosine, TOL),
    "hard_correlation_match": (_ref_hard_match, TOL),
    "soft_correlation_match": (_ref_soft_match, TOL),
    "gulp": (lambda x, y: _ref_gulp(x, y, 0.0), TOL),
    "eigenspace_overlap": (_ref_eigenspace_overlap, TOL),
    "magnitude_difference": (_difference(_ref_magnitude), TOL),
    "concentricity_difference": (_difference(_ref_concentricity), TOL),
    "uniformity_difference": (_difference(_ref_uniformity), TOL),
}
NEW = tuple(REFERENCES)


def test_every_new_measure_is_registered():
    assert set(NEW) <= set(MEASURES)
    assert {name for name in NEW if MEASURES[name].no_null} == {
        "magnitude_difference", "concentricity_difference", "uniformity_difference"}


# Widths: equal, x wider, y wider; brute force keeps the matchings small (soft: lcm(dx, dy) ≤ 6).
@pytest.mark.parametrize("widths", [(4, 4), (3, 2), (2, 3)])
@pytest.mark.parametrize("name", NEW)
def test_matches_the_papers_formula(rng, name, widths):
    reference, tol = REFERENCES[name]
    x, y = _related(rng, dx=widths[0], dy=widths[1])
    if name == "uniformity_difference":  # rows close enough that exp(−2 d²) is not all underflow
        x, y = 0.3 * x, 0.3 * y
    for a, b in ((x, y), (y, x)):
        assert similarity(name, a, b) == pytest.approx(reference(a, b), abs=tol)
    matrix = similarity_matrix(name, [x, y])
    assert matrix[0, 1] == pytest.approx(reference(x, y), abs=tol)
    assert matrix[1, 0] == pytest.approx(reference(y, x), abs=tol)


@pytest.mark.parametrize("ridge", [1e-3, 0.1, 3.0])
def test_gulp_with_a_ridge_matches_the_papers_formula(rng, ridge):
    x, y = _related(rng, n=40, dx=6, dy=3)
    assert similarity("gulp", x, y, ridge=ridge) == pytest.approx(_ref_gulp(x, y, ridge), abs=TOL)
    assert gulp_distance(x, y, ridge=ridge) == pytest.approx(_ref_gulp_distance(x, y, ridge)[0], abs=TOL)
    # A ridge shrinks each direction by e / (e + λ): no longer invariant to an invertible map of a layer.
    stretched = y @ np.diag([1.0, 10.0, 0.1])
    assert abs(similarity("gulp", x, stretched, ridge=ridge) - similarity("gulp", x, y, ridge=ridge)) > 1e-4
    rotation = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    assert similarity("gulp", x, 4.0 * y @ rotation + 2.0, ridge=ridge) == pytest.approx(
        similarity("gulp", x, y, ridge=ridge), abs=1e-10)


def test_gulp_at_ridge_zero_is_canonical_correlations(rng):
    """d²_0 = r_x + r_y − 2 Σ ρ², so s = 2 Σ ρ² / (r_x + r_y); and a large ridge tends to GULP's λ → ∞ limit."""
    x, y = _related(rng, n=60, dx=5, dy=3)
    rho = canonical_correlations(x, y)
    assert similarity("gulp", x, y) == pytest.approx(2 * np.sum(rho**2) / (5 + 3), abs=1e-12)
    assert gulp_distance(x, y) == pytest.approx(5 + 3 - 2 * np.sum(rho**2), abs=1e-10)
    assert similarity("gulp", x, y, ridge=1e-9) == pytest.approx(similarity("gulp", x, y), abs=1e-6)


def test_distances_recovered_from_the_similarities(rng):
    x, y = _related(rng, dx=5, dy=3)
    assert size_and_shape_distance(x, y) == pytest.approx(_ref_size_and_shape_distance(x, y), abs=1e-9)
    assert size_and_shape_distance(x, x + 3.0) == pytest.approx(0.0, abs=1e-6)
    # Scaling one side: s(X, cX) = 2c / (1 + c²) (the size is compared, unlike procrustes).
    assert similarity("size_and_shape", x, 3.0 * x) == pytest.approx(6.0 / 10.0, abs=1e-12)
    assert similarity("procrustes", x, 3.0 * x) == pytest.approx(1.0, abs=1e-12)
    # Khosla & Williams's soft-matching distance on z-scored neurons: min over plans of Σ P_kl ‖z_k − z_l‖², which
    # for unit-norm centred columns is 2 − 2 Σ P r (brute force over the 2 × 3 plans' vertices).
    assert soft_matching_distance(x[:, :2], y) ** 2 == pytest.approx(2 - 2 * _ref_soft_match(x[:, :2], y),
                                                                    abs=SOFT_TOL)
    assert summary_difference("magnitude_difference", x, y) == pytest.approx(
        abs(_ref_magnitude(x) - _ref_magnitude(y)), abs=1e-12)


def test_correlation_matches_by_hand():
    x = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 1.0], [3.0, 0.0]])
    r01 = _pearson(x[:, 0], x[:, 1])
    assert r01 == pytest.approx(-1 / math.sqrt(5), abs=1e-12)
    swapped = x[:, ::-1] * [2.0, 0.5]  # the neurons swapped and rescaled: the swap matching finds r = 1 twice
    for name in ("hard_correlation_match", "soft_correlation_match"):  # equal widths: soft = hard
        assert similarity(name, x, swapped) == pytest.approx(1.0, abs=1e-12)
        # One neuron sign-flipped: either matching now sums r = 1 and r = −1 (or r01 and −r01): 0, where neuronsim
        # (|r|, unmatched) still gives 1.
        flipped = np.column_stack([x[:, 1], -x[:, 0]])
        assert similarity(name, x, flipped) == pytest.approx(0.0, abs=1e-12)
    assert neuronsim(x, np.column_stack([x[:, 1], -x[:, 0]])) == pytest.approx(1.0)
    # One neuron against two copies of it: the hard match uses one of them (1) and the soft one spreads x's only
    # neuron over both (half each): also 1; against the neuron and its negation, hard 1 and soft 0.
    line = x[:, :1]
    assert similarity("hard_correlation_match", line, np.hstack([line, 2 * line])) == pytest.approx(1.0)
    assert similarity("soft_correlation_match", line, np.hstack([line, 2 * line])) == pytest.approx(1.0, abs=1e-9)
    assert similarity("hard_correlation_match", line, np.hstack([line, -line])) == pytest.approx(1.0)
    assert similarity("soft_correlation_match", line, np.hstack([line, -line])) == pytest.approx(0.0, abs=1e-9)


def test_soft_match_is_bounded_by_neuronsim(rng):
    """Σ P r ≤ mean_k max_l r_kl ≤ neuronsim (the module docstring's relation); hard = soft at equal widths."""
    for dx, dy in [(6, 6), (5, 8), (8, 3)]:
        x, y = _related(rng, n=80, dx=dx, dy=dy)
        soft = similarity("soft_correlation_match", x, y)
        assert soft <= neuronsim(x, y) + 1e-12
        if dx == dy:
            assert soft == pytest.approx(similarity("hard_correlation_match", x, y), abs=1e-12)


def test_aligned_cosine_of_a_rotated_copy_is_one_and_a_translation_moves_it(rng):
    x, _ = _related(rng, dx=4, dy=4)
    rotation = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    assert similarity("aligned_cosine", x, 5.0 * x @ rotation) == pytest.approx(1.0, abs=1e-12)
    assert similarity("aligned_cosine", x, x + 3.0) < 0.99
    # Wider y holding x's rotated copy in its first columns, zeros elsewhere: still 1 (ReSi's zero padding).
    assert similarity("aligned_cosine", x, np.hstack([x @ rotation, np.zeros((len(x), 3))])) == pytest.approx(1.0)


def test_the_summaries_by_hand():
    x = np.array([[3.0, 4.0], [3.0, 4.0], [-3.0, -4.0], [9.0, 12.0]])  # mean (3, 4): magnitude 5
    y = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])  # mean 0: magnitude 0
    assert similarity("magnitude_difference", x, y) == pytest.approx(1 / 6, abs=1e-15)
    # x's rows are ±(3, 4) multiples: cosines with the mean 1, 1, −1, 1 → 0.5; y's mean is 0 (cosine 0 by rule).
    assert similarity("concentricity_difference", x, y) == pytest.approx(1 / 1.5, abs=1e-15)
    close = np.array([[0.0], [0.5]])
    expected = math.log((2 + 2 * math.exp(-2 * 0.25)) / 4)
    assert summary_difference("uniformity_difference", close, close + 7.0) == pytest.approx(0.0, abs=1e-15)
    assert summary_difference("uniformity_difference", close, np.array([[0.0], [1e3]])) == pytest.approx(
        abs(expected - math.log(2 / 4)), abs=1e-12)


@pytest.mark.parametrize("name, message", [
    ("linear_regression", "linear_regression cannot be computed on n = 10 examples with y of width d = 9"),
    ("eigenspace_overlap", "eigenspace_overlap cannot be computed on n = 10 examples with y of width d = 9"),
    ("gulp", "or gulp with a ridge > 0"),
])
def test_a_layer_as_wide_as_the_examples_is_refused(rng, name, message):
    """Spanning every centred direction, it would compare as 1 with anything: refused in one sentence, the same
    from the sizes alone (check_computable) as on the data; gulp with a ridge stays defined."""
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 9))
    with pytest.raises(LayersimError, match=message):
        similarity(name, x, y)
    if name != "gulp":  # gulp's refusal depends on its ridge, which sizes alone do not give
        with pytest.raises(LayersimError, match=message.replace("y of", "a layer of")):
            check_computable(name, 10, 9)
        assert check_computable(name, 11, 9) is None
    else:
        assert 0.0 < similarity("gulp", x, y, ridge=0.1) < 1.0
    if name == "linear_regression":  # only the regressor: y predicting a narrow x is fine
        assert 0.0 < similarity(name, y, x) < 1.0


def test_bad_options_are_one_sentence(rng):
    x = rng.normal(size=(20, 3))
    with pytest.raises(LayersimError, match="ridge must be a finite number ≥ 0"):
        similarity("gulp", x, x, ridge=-1.0)
    with pytest.raises(LayersimError, match="unknown regression method 'lu'"):
        similarity("linear_regression", x, x, method="lu")


@pytest.mark.parametrize("name", [n for n in NEW if not MEASURES[n].no_null])
def test_nulls_permute_whole_examples(rng, name):
    """With groups, every null draw moves whole examples (issue 47): the engine applies the drawn permutation as
    given, so the null of a layer against a copy whose rows are permuted within examples is the same as against
    the original (a block draw cannot tell them apart), and a related pair is far above it."""
    groups = np.repeat(np.arange(15), 3)
    # Without offsets: aligned_cosine compares raw rows, whose shared mean would keep shuffled pairs alike.
    x, y = _related(rng, n=45, dx=3, dy=3, offset=0.0)
    null = permutation_matrix(name, [x], [y], permutations=30, seed=2, groups=groups)
    assert null.method == "block permutation"
    assert null.p_value[0, 0] == pytest.approx(1 / 31)
    assert null.null_mean[0, 0] < null.observed[0, 0]


def test_no_null_for_a_difference_of_summaries(rng):
    """A permutation of the examples leaves every summary alone: the would-be null is the observed value itself."""
    x, y = _related(rng)
    perm = rng.permutation(len(y))
    for name in ("magnitude_difference", "concentricity_difference", "uniformity_difference"):
        assert similarity(name, x, y[perm]) == pytest.approx(similarity(name, x, y), abs=1e-12)
        with pytest.raises(LayersimError, match=f"{name} has no null: a difference of summaries"):
            permutation_matrix(name, [x], [y], permutations=5)


def test_the_params_reach_the_measures():
    """similarity.measures accepts every new name, gulp_ridge reaches gulp's ridge (and is checked), and the
    differences of summaries are no sampled null that similarity.permutations must reach."""
    from layersim.params import parse_params
    from layersim.params.vocabulary import NO_NULL_MEASURE_NAMES
    from layersim.similarity.results import settings

    assert set(NO_NULL_MEASURE_NAMES) == {name for name, m in MEASURES.items() if m.no_null}
    base = {"model": "tiny-bert", "tasks": ["rte"], "seeds": [1], "finetune": {"max_length": 32}}
    params = parse_params(base | {"similarity": {"measures": {"head": list(NEW)}, "gulp_ridge": 0.25}})
    assert list(params.similarity.measures.values()) == [NEW]  # "head" resolved to the model's token
    assert settings(params.similarity)[0]["gulp"] == {"ridge": 0.25}
    with pytest.raises(LayersimError, match="similarity.gulp_ridge"):
        parse_params(base | {"similarity": {"gulp_ridge": -1}})
    # Two permutations cannot reach p < 0.05, which only matters for a measure with a sampled null.
    only_summaries = {"measures": {"head": list(NO_NULL_MEASURE_NAMES)}, "permutations": 2}
    assert parse_params(base | {"similarity": only_summaries}).similarity.permutations == 2
    with pytest.raises(LayersimError, match="cannot reach similarity.significance"):
        parse_params(base | {"similarity": {"measures": {"head": ["gulp"]}, "permutations": 2}})


@pytest.mark.parametrize("widths", [(2, 3), (3, 2), (4, 4), (5, 3)])
def test_the_transport_lp_and_the_replicated_assignment_agree(rng, monkeypatch, widths):
    """Both exact routes of the soft match: the assignment on replicated neurons and, forced, the LP (HiGHS)."""
    import layersim.similarity.matching as matching

    x, y = _related(rng, dx=widths[0], dy=widths[1])
    replicated = similarity("soft_correlation_match", x, y)
    monkeypatch.setattr(matching, "REPLICATED_MAX", 0)
    assert similarity("soft_correlation_match", x, y) == pytest.approx(replicated, abs=SOFT_TOL)
    if widths[0] * widths[1] <= 6 or widths[0] == widths[1]:  # brute force stays small (lcm ≤ 6, or L = d)
        assert replicated == pytest.approx(_ref_soft_match(x, y), abs=1e-12)
    plan = matching.transport_plan(np.asarray(_correlation_table(x, y)))
    np.testing.assert_allclose(plan.sum(axis=1), 1 / widths[0], atol=1e-9)
    np.testing.assert_allclose(plan.sum(axis=0), 1 / widths[1], atol=1e-9)
    assert plan.min() >= -1e-12
