"""ReSi's measures and the platonic-representation work's (layersim.similarity.rsm, layersim.similarity.knn_measures)
against their papers' formulas written out here as plain loops (no layersim code), against dcor where it is
installed, and against ReSi's code where it differs (the differences docs/peers.md states, reproduced); their null
engines (rows and whole examples permuted) and bootstrap copies. Their invariances are in test_measures.py's
INVARIANT table, with the rest of the registry's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layersim.errors import LayersimError
from layersim.params import parse_params
from layersim.similarity import (check_computable, get_measure, permutation_matrix, permutation_test, similarity,
                                 similarity_matrix)
from layersim.similarity.inference._host_engines import recomputed_engine
from layersim.similarity.inference._null_engines import ENGINES
from layersim.similarity.inference.bootstrap import bootstrap_pairs, resample_rows
from layersim.similarity.inference.exchangeability import block_permutations
from layersim.similarity.results import settings as stage_settings
from layersim.similarity.rsm import rsm_difference_norm, rsm_norm_matrix

NEIGHBOUR_MEASURES = ("mutual_knn", "rank_similarity", "second_order_cosine", "cknna")
NEW = ("distance_correlation", "rsm_norm") + NEIGHBOUR_MEASURES


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _related(rng, n=45, p=5, q=4, noise=0.7):
    x = rng.normal(size=(n, p))
    return x, x @ rng.normal(size=(p, q)) + noise * rng.normal(size=(n, q)) + 0.5


# --- the papers' formulas, one loop per sum ---


def _distances(a):
    n = len(a)
    return [[math.sqrt(sum((a[i][t] - a[j][t]) ** 2 for t in range(len(a[i])))) for j in range(n)] for i in range(n)]


def _dcov2(d, e):
    """Székely et al. 2007, eq. 2.8: (1/n²) Σ A_kl B_kl with A_kl = a_kl − ā_k· − ā_·l + ā_··."""
    n = len(d)

    def centred(m):
        rows = [sum(m[k]) / n for k in range(n)]
        cols = [sum(m[k][l] for k in range(n)) / n for l in range(n)]
        grand = sum(rows) / n
        return [[m[k][l] - rows[k] - cols[l] + grand for l in range(n)] for k in range(n)]

    a, b = centred(d), centred(e)
    return sum(a[k][l] * b[k][l] for k in range(n) for l in range(n)) / n ** 2


def ref_distance_correlation(x, y):
    dx, dy = _distances(x.tolist()), _distances(y.tolist())
    return math.sqrt(_dcov2(dx, dy) / math.sqrt(_dcov2(dx, dx) * _dcov2(dy, dy)))


def ref_rsm_norm(x, y):
    dx, dy = _distances(x.tolist()), _distances(y.tolist())
    n = len(dx)
    diff = math.sqrt(sum((dx[i][j] - dy[i][j]) ** 2 for i in range(n) for j in range(n)))
    return 1 - diff / math.sqrt(sum(v * v for row in dx + dy for v in row))


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def _knn(a, k):
    """Each row's k nearest other rows by cosine, nearest first, ties to the lower index; and the cosine table."""
    rows = a.tolist()
    cos = [[_cos(u, v) for v in rows] for u in rows]
    return [sorted((j for j in range(len(rows)) if j != i), key=lambda j: (-cos[i][j], j))[:k]
            for i in range(len(rows))], cos


def ref_mutual_knn(x, y, k):
    nx, _ = _knn(x, k)
    ny, _ = _knn(y, k)
    return sum(len(set(a) & set(b)) / k for a, b in zip(nx, ny)) / len(nx)


def ref_rank_similarity(x, y, k):
    """Wang et al. 2020 as ReSi: Σ_j 2 / ((1 + |r − r'|)(r + r')) over shared j, over Σ_{m ≤ |shared|} 1/m."""
    nx, _ = _knn(x, k)
    ny, _ = _knn(y, k)
    total = 0.0
    for a, b in zip(nx, ny):
        shared = set(a) & set(b)
        if shared:
            score = sum(2 / ((1 + abs(a.index(j) - b.index(j))) * (a.index(j) + 1 + b.index(j) + 1)) for j in shared)
            total += score / sum(1 / m for m in range(1, len(shared) + 1))
    return total / len(nx)


def ref_second_order_cosine(x, y, k, fill=lambda c: c):
    """Hamilton et al. 2016, eq. 2: the cosine of the similarity vectors over N^x(a) ∪ N^y(a); ``fill`` = 1 − c
    is ReSi's code (cosine distances)."""
    nx, cx = _knn(x, k)
    ny, cy = _knn(y, k)
    values = []
    for a in range(len(nx)):
        union = sorted(set(nx[a]) | set(ny[a]))
        values.append(_cos([fill(cx[a][j]) for j in union], [fill(cy[a][j]) for j in union]))
    return sum(values) / len(values)


def ref_cknna(x, y, k):
    """Huh et al. 2024, appendix A: Σ_a Σ_j α_aj (K_aj − E_l K_al)(L_aj − E_l L_al), E over l ≠ a."""
    nx, kx = _knn(x, k)
    ny, ky = _knn(y, k)
    n = len(nx)

    def align(ka, na, kb, nb):
        total = 0.0
        for a in range(n):
            mean_a = sum(ka[a][l] for l in range(n) if l != a) / (n - 1)
            mean_b = sum(kb[a][l] for l in range(n) if l != a) / (n - 1)
            total += sum((ka[a][j] - mean_a) * (kb[a][j] - mean_b) for j in set(na[a]) & set(nb[a]))
        return total

    return align(kx, nx, ky, ny) / math.sqrt(align(kx, nx, kx, nx) * align(ky, ny, ky, ny))


REFERENCES = {
    "distance_correlation": lambda x, y: ref_distance_correlation(x, y),
    "rsm_norm": lambda x, y: ref_rsm_norm(x, y),
    "mutual_knn": lambda x, y: ref_mutual_knn(x, y, 6),
    "rank_similarity": lambda x, y: ref_rank_similarity(x, y, 6),
    "second_order_cosine": lambda x, y: ref_second_order_cosine(x, y, 6),
    "cknna": lambda x, y: ref_cknna(x, y, 6),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("measure", NEW)
def test_equals_the_papers_formula(measure, seed):
    x, y = _related(np.random.default_rng(seed))
    options = {"k": 6} if measure in NEIGHBOUR_MEASURES else {}
    value = similarity(measure, x, y, **options)
    assert value == pytest.approx(REFERENCES[measure](x, y), abs=1e-12)
    assert similarity(measure, y, x, **options) == pytest.approx(value, abs=1e-12)
    assert 0.05 < abs(value) < 0.99  # a value where a mistake could show


def test_distance_correlation_is_dcors(rng):
    dcor = pytest.importorskip("dcor")
    for n, p, q in [(30, 3, 5), (80, 7, 2)]:
        x = rng.normal(size=(n, p))
        y = np.tanh(x[:, :1]) @ rng.normal(size=(1, q)) + rng.normal(size=(n, q))
        assert similarity("distance_correlation", x, y) == pytest.approx(dcor.distance_correlation(x, y), abs=1e-12)


def test_small_cases_by_hand():
    # Rows on the unit circle at 0, 10, 30, 100 and 110 degrees; y swaps the representations of examples 3 and 4,
    # which stay each other's nearest and keep 30° second: no neighbourhood measure can see the swap.
    angles = np.radians([0, 10, 30, 100, 110])
    x = np.column_stack([np.cos(angles), np.sin(angles)])
    y = x[[0, 1, 2, 4, 3]]
    assert similarity("mutual_knn", x, y, k=1) == 1.0
    assert similarity("rank_similarity", x, y, k=2) == pytest.approx(1.0, abs=1e-15)
    # Rows (1, t) sit at the angles atan(t): x at 0, 5.7, 16.7, −19.3 degrees, y at 0, 16.7, 5.7, −2.9. Two nearest,
    # nearest first: x 0 → (1, 2), 1 → (0, 2), 2 → (1, 0), 3 → (0, 1); y 0 → (3, 2), 1 → (2, 0), 2 → (0, 3),
    # 3 → (0, 2). Shared (rank in x, rank in y): row 0 {2: (2, 2)}: 2/(1·4) = 1/2; row 1 {0: (1, 2), 2: (2, 1)}:
    # (1/3 + 1/3) / (1 + 1/2) = 4/9; row 2 {0: (2, 1)}: 2/(2·3) = 1/3; row 3 {0: (1, 1)}: 1.
    line = np.array([[1.0, 0.0], [1.0, 0.1], [1.0, 0.3], [1.0, -0.35]])
    other = np.array([[1.0, 0.0], [1.0, 0.3], [1.0, 0.1], [1.0, -0.05]])
    assert similarity("rank_similarity", line, other, k=2) == pytest.approx((1 / 2 + 4 / 9 + 1 / 3 + 1) / 4,
                                                                            abs=1e-15)
    assert similarity("mutual_knn", line, other, k=2) == pytest.approx((1 + 2 + 1 + 1) / 8, abs=1e-15)


def test_the_rsm_norm_is_the_frobenius_distance_mapped(rng):
    x, y = _related(rng)
    dx = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    dy = np.sqrt(((y[:, None] - y[None]) ** 2).sum(-1))
    assert rsm_difference_norm(x, y) == pytest.approx(np.linalg.norm(dx - dy), rel=1e-12)
    assert rsm_difference_norm(x, y, norm="spectral") == pytest.approx(np.linalg.norm(dx - dy, 2), rel=1e-12)
    assert similarity("rsm_norm", x, y) == pytest.approx(
        1 - np.linalg.norm(dx - dy) / np.sqrt(np.sum(dx ** 2) + np.sum(dy ** 2)), abs=1e-12)
    with pytest.raises(LayersimError, match="unknown RSM norm 'nuclear'"):
        rsm_difference_norm(x, y, norm="nuclear")


# --- invariances as properties: claimed ones hold, the others (the measure's nature) do not ---


@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 32 - 1))
@pytest.mark.parametrize("measure", NEW)
def test_declared_invariances_hold_and_no_others(measure, seed):
    from test_measures import INVARIANT, TRANSFORMS

    rng = np.random.default_rng(seed)
    x, y = _related(rng, n=40, p=6, q=5, noise=0.5)
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)  # the cosine measures' values away from 1
    base = similarity(measure, x, y)
    for name, transform in TRANSFORMS.items():
        moved = similarity(measure, *transform(rng, x, y))
        if name in INVARIANT[measure]:
            assert moved == pytest.approx(base, abs=1e-9), name
        else:
            assert abs(moved - base) > 1e-6, name


# --- ReSi's code where it differs (docs/peers.md), reproduced ---


def resi_second_order_cosine(x, y, k):
    """ReSi's second_order_cosine_similarity: the vectors hold sklearn's cosine *distances* 1 − cos."""
    return ref_second_order_cosine(x, y, k, fill=lambda c: 1 - c)


def platonic_cknna(x, y, k):
    """The platonic-representation code's CKNNA, its steps written out: cosine kernels, the mask of mutual top-k
    neighbours, Song et al.'s unbiased HSIC of the masked kernels, 1e-6 added to the denominator."""
    u, v = (a / np.linalg.norm(a, axis=1, keepdims=True) for a in (x, y))
    kx, ky = u @ u.T, v @ v.T
    n = len(kx)

    def mask(m):
        score = m.copy()
        np.fill_diagonal(score, -np.inf)
        out = np.zeros_like(m)
        np.put_along_axis(out, np.argsort(-score, axis=1, kind="stable")[:, :k], 1.0, axis=1)
        return out

    def hsic_unbiased(a, b):
        a, b = a.copy(), b.copy()
        np.fill_diagonal(a, 0.0)
        np.fill_diagonal(b, 0.0)
        return (np.sum(a * b.T) + a.sum() * b.sum() / ((n - 1) * (n - 2)) - 2 * np.sum(a @ b) / (n - 2)) / (n * (n - 3))

    def align(a, b):
        both = mask(a) * mask(b)
        return hsic_unbiased(both * a, both * b)

    return align(kx, ky) / (np.sqrt(align(kx, kx) * align(ky, ky)) + 1e-6)


def test_resi_differences_as_documented():
    """The numbers docs/peers.md gives for ReSi's second-order cosine (distances, not similarities) and its spectral
    RSM norm, on the data written there."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 16))
    y = x @ rng.normal(size=(16, 16)) / 4 + 0.8 * rng.normal(size=(100, 16))
    independent = rng.normal(size=(100, 16))
    assert round(similarity("second_order_cosine", x, y), 3) == 0.574
    assert round(resi_second_order_cosine(x, y, 10), 3) == 0.890
    # Distances 1 − cos are all near 1, so their vectors point alike whatever the layers: 0.82 for independent data.
    assert round(similarity("second_order_cosine", x, independent), 3) == -0.081
    assert round(resi_second_order_cosine(x, independent, 10), 3) == 0.819
    # The spectral norm sees the largest direction of D_x − D_y only: 0.89 of the Frobenius norm here, 0.50 once y is
    # rescaled by 0.75, which takes most of the common scale difference out.
    assert (round(rsm_difference_norm(x, y), 1), round(rsm_difference_norm(x, y, norm="spectral"), 1)) == (221.7, 198.1)
    assert (round(rsm_difference_norm(x, 0.75 * y), 1),
            round(rsm_difference_norm(x, 0.75 * y, norm="spectral"), 1)) == (103.6, 51.5)
    # The platonic code's CKNNA (unbiased HSIC of the masked kernels) against the paper's formula: close, not equal.
    assert (round(similarity("cknna", x, y), 3), round(platonic_cknna(x, y, 10), 3)) == (0.331, 0.313)
    assert (round(similarity("cknna", x, independent), 3), round(platonic_cknna(x, independent, 10), 3)) == (0.098,
                                                                                                          0.088)


# --- nulls and bootstrap ---


@pytest.mark.parametrize("measure", NEW)
def test_the_null_engine_is_the_measure_on_permuted_rows(measure, rng):
    x, y = _related(rng, n=40)
    z = rng.normal(size=(40, 3))
    perm = rng.permutation(40)
    engine = ENGINES[measure]([("x", x), ("z", z)], [("y", y), ("z", z)], np.ones((2, 2), bool))
    for value, (a, b) in zip(engine.values(perm).ravel(), [(x, y), (x, z), (z, y), (z, z)]):
        assert value == pytest.approx(similarity(measure, a, b[perm]), abs=1e-9)
    np.testing.assert_allclose(engine.values(None), similarity_matrix(measure, [x, z], [y, z]), atol=1e-9)
    generic = recomputed_engine(get_measure(measure).matrix)([("x", x), ("z", z)], [("y", y), ("z", z)], np.ones((2, 2), bool))
    np.testing.assert_allclose(generic.values(perm), engine.values(perm), atol=1e-9)
    null = permutation_test(measure, x, y, permutations=30)
    assert null.p_value == pytest.approx(1 / 31) and null.null_mean < null.observed


@pytest.mark.parametrize("measure", ["distance_correlation", "cknna"])
def test_block_nulls_move_whole_examples(measure, rng):
    """Rows of one example (issue 47's blocks) move together: the null is the measure on the block-permuted rows,
    the draws of exchangeability.block_permutations."""
    groups = np.repeat(np.arange(15), 3)
    x, y = _related(rng, n=45)
    result = permutation_matrix(measure, [x], [y], permutations=8, seed=3, groups=groups)
    assert result.method == "block permutation"
    blocks, draw = block_permutations(45, groups, None), np.random.default_rng(3)
    values = []
    for _ in range(8):
        perm = blocks.draw(draw)
        assert all(len(set(groups[perm[groups == g]])) == 1 for g in range(15))  # an example's rows stay together
        values.append(similarity(measure, x, y[perm]))
    assert result.null_mean[0, 0] == pytest.approx(np.mean(values), abs=1e-9)


@pytest.mark.parametrize("measure", ["mutual_knn", "second_order_cosine", "cknna"])
def test_every_row_twice_is_the_original(measure, rng):
    """A resample drawing every example twice is the sample weighted evenly: with the copies told apart (sources)
    and twice the neighbours, the value is the original's; without, copies are each other's neighbours."""
    x, y = _related(rng, n=30)
    rows = np.repeat(np.arange(30), 2)
    pair = get_measure(measure).pair  # sources: the bootstrap's, not a user's option
    twice = pair(x[rows], y[rows], k=10, sources=rows)
    assert twice == pytest.approx(similarity(measure, x, y, k=5), abs=1e-12)
    assert pair(x[rows], y[rows], k=10) != pytest.approx(twice, abs=1e-3)


def test_bootstrap_tells_copies_apart(rng):
    x, y = _related(rng, n=40)
    result = bootstrap_pairs("mutual_knn", [x], [y], resamples=4, seed=2, interval="percentile", k=4)
    for value, rows in zip(result.values[:, 0], resample_rows(40, 4, 2)):
        assert value == pytest.approx(get_measure("mutual_knn").pair(x[rows], y[rows], k=4, sources=rows), abs=1e-12)
    auto = bootstrap_pairs("cknna", [x], [y], resamples=3, k=4)
    # CKNNA's coverage is measured (MEASURED_COVERAGE) and, since a cluster's other draws are no row's neighbours,
    # holds on clustered rows too (basic 0.935 on the review's rows, 0.975 with premises as blocks): auto gives basic
    assert auto.method == "basic" and auto.note is None and auto.low[0] <= auto.high[0]


# --- sizes and params ---


def test_sizes_refused_before_any_work():
    with pytest.raises(LayersimError, match=r"^distance_correlation and rsm_norm on n = 6000 examples would hold an "
                                            r"n x n distance matrix per layer \(0\.3 GiB each\)"):
        check_computable("distance_correlation", 6000, 768)
    with pytest.raises(LayersimError, match="above their limit of 5000 rows"):
        similarity("rsm_norm", np.zeros((5001, 2)), np.zeros((5001, 2)))
    for measure in NEIGHBOUR_MEASURES:  # n × k lists only
        check_computable(measure, 50_000, 768)
    with pytest.raises(LayersimError, match="k must be an integer from 1 to n − 2 = 18"):
        similarity("cknna", np.eye(20), np.eye(20), k=19)


def test_undefined_inputs_are_named(rng):
    x = rng.normal(size=(10, 3))
    x[4] = 0.0
    with pytest.raises(LayersimError, match=r"^x has 1 example\(s\) whose row is 0 \(first: row 4\)"):
        similarity("mutual_knn", x, rng.normal(size=(10, 3)), k=3)


def test_the_params_reach_the_measures():
    base = {"model": "tiny-bert", "tasks": ["rte"], "seeds": [1], "finetune": {"max_length": 32}}
    params = parse_params(base | {"similarity": {"measures": {"head": list(NEW)}, "knn_k": 7}})
    assert list(params.similarity.measures.values()) == [NEW]  # "head": the model's own token
    options, _ = stage_settings(params.similarity)
    assert all(options[m] == {"k": 7} for m in NEIGHBOUR_MEASURES)
    assert "distance_correlation" not in options and "rsm_norm" not in options  # no options
    with pytest.raises(LayersimError, match="dcor"):
        parse_params(base | {"similarity": {"measures": {"head": ["dcor"]}}})


def test_rsm_norm_matrix_entries(rng):
    xs = [rng.normal(size=(30, w)) for w in (3, 5, 4)]
    matrix = rsm_norm_matrix(xs)
    assert matrix[0, 1] == pytest.approx(ref_rsm_norm(xs[0], xs[1]), abs=1e-12)
