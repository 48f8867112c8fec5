"""Tests for the similarity-measure suite (Wu et al. 2020): CCA family, kernel CKAs, neuron-level
measures, the registry and all-pairs matrices, attention measures and localization scores.

Values are checked against reference formulas written here from the papers' definitions
(covariance-based CCA, the Gram-matrix U-statistic of Song et al. 2012, least squares with an
explicit intercept column, scipy's Jensen–Shannon distance, ...) and against small examples worked
out by hand; the invariances each measure should have — and some it should not — are checked too.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon, pdist, squareform
from scipy.stats import pearsonr

from layersim.errors import LayersimError
from layersim.similarity import (
    MEASURES,
    AttentionMaps,
    attention_similarity,
    attention_similarity_matrix,
    canonical_correlations,
    cca,
    check_computable,
    debiased_cka,
    get_measure,
    head_similarities,
    kernels,
    linear_cka,
    localization_scores,
    mean_cca_r2,
    mean_similarity_per_layer,
    mixedsim,
    mixedsim_per_neuron,
    neurons,
    neuronsim,
    neuronsim_per_neuron,
    pwcca,
    rbf_cka,
    similarity,
    similarity_matrix,
    svcca,
)

NAMES = sorted(MEASURES)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def _ill_conditioned(rng: np.random.Generator, d: int) -> np.ndarray:
    """Invertible, condition number 1e3: stretches some directions far more than others."""
    return _orthogonal(rng, d) @ np.diag(np.logspace(0, 3, d)) @ _orthogonal(rng, d)


def _pair(rng: np.random.Generator, n: int = 300, dx: int = 6, dy: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Related but not identical representations, with offsets and unequal neuron scales; y depends
    on only half of x's neurons, so x's neurons differ in how well y predicts them."""
    x = rng.normal(size=(n, dx)) * rng.uniform(0.5, 2.0, size=dx) + 2.0
    y = np.tanh(x[:, : dx // 2] @ rng.normal(size=(dx // 2, dy))) + 0.5 * rng.normal(size=(n, dy)) - 1.0
    return x, y


def _layers(rng: np.random.Generator, n: int, widths: list[int]) -> list[np.ndarray]:
    """A chain of 'layers': each a noisy nonlinear map of the previous one."""
    layers = [rng.normal(size=(n, widths[0]))]
    for d in widths[1:]:
        prev = layers[-1]
        layers.append(np.tanh(prev @ rng.normal(size=(prev.shape[1], d))) + 0.4 * rng.normal(size=(n, d)) + 1.0)
    return layers


def _raises(fn, *args, message: str, **kwargs) -> str:
    with pytest.raises(LayersimError, match=re.escape(message)) as err:
        fn(*args, **kwargs)
    return str(err.value)


# --- reference implementations, straight from the definitions ---


def _inv_sqrt(c: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(c)
    return (v / np.sqrt(w)) @ v.T


def _ref_cca(x: np.ndarray, y: np.ndarray):
    """Classical CCA from covariance matrices (full-rank inputs only): correlations and the unit-norm
    canonical variates of x."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    sxx_h, syy_h = _inv_sqrt(xc.T @ xc), _inv_sqrt(yc.T @ yc)
    u, rho, _ = np.linalg.svd(sxx_h @ (xc.T @ yc) @ syy_h, full_matrices=False)
    h = xc @ sxx_h @ u
    return rho, h / np.linalg.norm(h, axis=0)


def _ref_pwcca(x: np.ndarray, y: np.ndarray) -> float:
    rho, h = _ref_cca(x, y)
    alpha = np.abs(h.T @ (x - x.mean(0))).sum(axis=1)
    return float(alpha @ rho / alpha.sum())


def _ref_svcca(x: np.ndarray, y: np.ndarray, threshold: float) -> float:
    reduced = []
    for a in (x, y):
        u, s, _ = np.linalg.svd(a - a.mean(0), full_matrices=False)
        share = np.cumsum(s**2) / np.sum(s**2)
        k = next(i + 1 for i, v in enumerate(share) if v >= threshold - 1e-15)
        reduced.append(u[:, :k] * s[:k])
    return float(_ref_cca(*reduced)[0].mean())


def _ref_rbf_cka(x: np.ndarray, y: np.ndarray, scale: float = 1.0) -> float:
    n = len(x)
    h = np.eye(n) - 1.0 / n

    def kernel(a):
        d = pdist(a)  # the n(n-1)/2 distances between distinct examples
        sigma = scale * np.median(d)
        return np.exp(-squareform(d) ** 2 / (2 * sigma**2))

    k, l = h @ kernel(x) @ h, h @ kernel(y) @ h
    return float(np.sum(k * l) / np.sqrt(np.sum(k * k) * np.sum(l * l)))


def _ref_debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Song et al. 2012, eq. 5, on the uncentred linear kernels (the U-statistic ignores translation)."""
    n = len(x)
    one = np.ones(n)

    def hsic(k, l):
        k, l = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
        return (np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * one @ k @ l @ one) / (n * (n - 3))

    k, l = x @ x.T, y @ y.T
    return float(hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l)))


def _ref_neuronsim(x: np.ndarray, y: np.ndarray) -> float:
    c = np.corrcoef(x.T, y.T)[: x.shape[1], x.shape[1] :]
    return float(np.abs(c).max(axis=1).mean())


def _ref_mixedsim(x: np.ndarray, y: np.ndarray) -> float:
    design = np.column_stack([np.ones(len(y)), y])  # explicit intercept
    values = []
    for k in range(x.shape[1]):
        coef, *_ = np.linalg.lstsq(design, x[:, k], rcond=None)
        resid = x[:, k] - design @ coef
        tot = x[:, k] - x[:, k].mean()
        values.append(np.sqrt(1.0 - resid @ resid / (tot @ tot)))
    return float(np.mean(values))


REFERENCES = {
    "linear_cka": None,  # tested against its own plain formula in test_cka.py
    "rbf_cka": _ref_rbf_cka,
    "debiased_cka": _ref_debiased_cka,
    "svcca": lambda x, y: _ref_svcca(x, y, 0.99),
    "pwcca": _ref_pwcca,
    "mean_cca": lambda x, y: float(np.mean(_ref_cca(x, y)[0] ** 2)),
    "neuronsim": _ref_neuronsim,
    "mixedsim": _ref_mixedsim,
    # The peers' measures: by hand, invariances and against their packages in test_peer_measures.py and
    # test_peer_oracles.py.
    "procrustes": None,
    "shape_metric": None,
    "rsa": None,
    "knn_jaccard": None,
    # ReSi's and the platonic-representation work's: loop-written paper formulas in test_resi_measures.py.
    "distance_correlation": None,
    "rsm_norm": None,
    "mutual_knn": None,
    "rank_similarity": None,
    "second_order_cosine": None,
    "cknna": None,
    # ReSi's measures: against slow loop references of their papers' formulas in test_resi_measures.py.
    **{name: None for name in ("linear_regression", "size_and_shape", "aligned_cosine", "hard_correlation_match",
                               "soft_correlation_match", "gulp", "eigenspace_overlap", "magnitude_difference",
                               "concentricity_difference", "uniformity_difference")},
}


# --- against references and by hand ---


@pytest.mark.parametrize("name", [n for n in NAMES if REFERENCES[n] is not None])
def test_matches_reference_formula(rng, name):
    x, y = _pair(rng, n=120)
    ref = REFERENCES[name]
    assert similarity(name, x, y) == pytest.approx(ref(x, y), abs=1e-9)
    assert similarity(name, y, x) == pytest.approx(ref(y, x), abs=1e-9)


def test_canonical_correlations_match_covariance_formula(rng):
    x, y = _pair(rng, n=200)
    rho = canonical_correlations(x, y)
    assert rho.shape == (6,)
    np.testing.assert_allclose(rho, _ref_cca(x, y)[0], rtol=0, atol=1e-10)
    assert np.all(np.diff(rho) <= 0)


def test_one_dimensional_cca_is_absolute_pearson(rng):
    x = rng.normal(size=(50, 1))
    y = -0.6 * x + rng.normal(size=(50, 1))
    r = abs(pearsonr(x[:, 0], y[:, 0]).statistic)
    for method in ("svd", "qr"):
        assert canonical_correlations(x, y, method=method) == pytest.approx([r], abs=1e-12)
    assert svcca(x, y) == pytest.approx(r, abs=1e-12)
    assert pwcca(x, y) == pytest.approx(r, abs=1e-12)
    assert mean_cca_r2(x, y) == pytest.approx(r**2, abs=1e-12)
    assert neuronsim(x, y) == pytest.approx(r, abs=1e-12)
    assert mixedsim(x, y) == pytest.approx(r, abs=1e-12)
    assert linear_cka(x, y) == pytest.approx(r**2, abs=1e-12)
    assert debiased_cka(x, x) == pytest.approx(1.0, abs=1e-12)


# Three centred, mutually orthogonal contrasts on 4 examples, each of norm 2.
U1 = np.array([1.0, 1.0, -1.0, -1.0])
U2 = np.array([1.0, -1.0, 1.0, -1.0])
U3 = np.array([1.0, -1.0, -1.0, 1.0])


def test_hand_computed_neuron_measures():
    x = np.column_stack([U1, U2]) + 10.0
    y = np.column_stack([U1 + U2, U3])
    # corr(u1, u1+u2) = u1·(u1+u2) / (|u1| |u1+u2|) = 4 / (2 · 2√2) = 1/√2, likewise u2; corr(·, u3) = 0.
    assert neuronsim(x, y) == pytest.approx(1 / np.sqrt(2), abs=1e-14)
    # y's first neuron matches either of x's at 1/√2, its second matches nothing: (1/√2 + 0) / 2.
    assert neuronsim(y, x) == pytest.approx(1 / (2 * np.sqrt(2)), abs=1e-14)
    scores = neuronsim_per_neuron(y, x)
    np.testing.assert_allclose(scores.values, [1 / np.sqrt(2), 0.0], atol=1e-14)
    assert scores.neurons.tolist() == [0, 1] and scores.matches[0] == 0  # first of the tied matches
    # Regressing u1 on span{u1+u2, u3}: prediction (u1·(u1+u2)/8)(u1+u2) has norm √2, |u1| = 2: R = 1/√2.
    assert mixedsim(x, y) == pytest.approx(1 / np.sqrt(2), abs=1e-14)
    # u1+u2 lies in span{u1, u2} (R = 1), u3 is orthogonal to it (R = 0).
    assert mixedsim(y, x) == pytest.approx(0.5, abs=1e-14)
    assert mixedsim_per_neuron(y, x).values == pytest.approx([1.0, 0.0], abs=1e-14)


def test_hand_computed_cca_measures():
    # 4 examples: the default cap (max_dims="auto") would keep one dimension, so these check plain CCA.
    x = np.column_stack([U1, U1 + U2])
    y = np.column_stack([U1 + U2, U3])
    # span x = {u1, u2}, span y = {u1+u2, u3}: they share u1+u2 (ρ = 1); x's other direction u1-u2 is
    # orthogonal to all of y (ρ = 0).
    for method in ("svd", "qr"):
        assert canonical_correlations(x, y, method=method) == pytest.approx([1.0, 0.0], abs=1e-14)
    assert mean_cca_r2(x, y, max_dims=None) == pytest.approx(0.5, abs=1e-14)
    assert svcca(x, y, variance_threshold=1.0, max_dims=None) == pytest.approx(0.5, abs=1e-14)
    # PWCCA weighted by x: h1 = (u1+u2)/2√2, h2 = (u1-u2)/2√2; α1 ∝ |h1·u1| + |h1·(u1+u2)| = 4 + 8,
    # α2 ∝ |h2·u1| + |h2·(u1+u2)| = 4 + 0, so weights 3/4, 1/4 and PWCCA = 3/4.
    assert pwcca(x, y, max_dims=None) == pytest.approx(0.75, abs=1e-14)
    # Weighted by y: g1 = (u1+u2)/2√2 with α1 = 8/2√2 = 2√2, g2 = u3/2 with α2 = 4/2 = 2,
    # so PWCCA = 2√2/(2√2+2) = 2 - √2.
    assert pwcca(y, x, max_dims=None) == pytest.approx(2 - np.sqrt(2), abs=1e-14)


def test_hand_computed_svcca_cut():
    # x has principal directions u1, u2, u3 with singular values 20, 4, 0.2: variance shares
    # 400/416.04 = 0.961, 416/416.04 = 0.9999, 1. y = u2 + u3 makes angle 90°, 45°, 0° with the top
    # 1, 2, 3 principal directions of x.
    x = np.column_stack([10 * U1, 2 * U2, 0.1 * U3])
    y = (U2 + U3)[:, None]
    assert svcca(x, y, variance_threshold=0.95, max_dims=None) == pytest.approx(0.0, abs=1e-14)
    assert svcca(x, y, variance_threshold=0.99, max_dims=None) == pytest.approx(1 / np.sqrt(2), abs=1e-14)
    assert svcca(x, y, variance_threshold=1.0, max_dims=None) == pytest.approx(1.0, abs=1e-14)


def test_rbf_bandwidth_scale(rng):
    x, y = _pair(rng, n=60)
    for scale in (0.5, 2.0):
        assert rbf_cka(x, y, sigma_scale=scale) == pytest.approx(_ref_rbf_cka(x, y, scale), abs=1e-12)
    assert rbf_cka(x, y, 0.5) != pytest.approx(rbf_cka(x, y, 2.0), abs=1e-3)


# --- properties ---


@pytest.mark.parametrize("name", NAMES)
def test_identical_inputs_give_one(rng, name):
    x, _ = _pair(rng, n=80)
    assert similarity(name, x, x) == pytest.approx(1.0, abs=1e-12)
    if {"isotropic_scale", "translation"} <= INVARIANT[name]:  # not for the measures that compare sizes or offsets
        assert similarity(name, x, x.copy() * 3.0 + 1.0) == pytest.approx(1.0, abs=1e-12)


def _permute(rng, x, y):
    return x[:, rng.permutation(x.shape[1])], y[:, rng.permutation(y.shape[1])]


TRANSFORMS = {
    "orthogonal": lambda rng, x, y: (x @ _orthogonal(rng, x.shape[1]), y @ _orthogonal(rng, y.shape[1])),
    "orthogonal_y": lambda rng, x, y: (x, y @ _orthogonal(rng, y.shape[1])),
    "isotropic_scale": lambda rng, x, y: (3.7 * x, 0.02 * y),
    "translation": lambda rng, x, y: (x + 100.0, y - rng.normal(size=y.shape[1])),
    "permutation": _permute,
    "neuron_scale": lambda rng, x, y: (-x * rng.uniform(0.1, 10, size=x.shape[1]),
                                       y * rng.uniform(0.1, 10, size=y.shape[1])),
    "invertible_x": lambda rng, x, y: (x @ _ill_conditioned(rng, x.shape[1]), y),
    "invertible_y": lambda rng, x, y: (x, y @ _ill_conditioned(rng, y.shape[1])),
}
COMMON = {"isotropic_scale", "translation", "permutation"}
INVARIANT = {
    "linear_cka": COMMON | {"orthogonal", "orthogonal_y"},
    "rbf_cka": COMMON | {"orthogonal", "orthogonal_y"},
    "debiased_cka": COMMON | {"orthogonal", "orthogonal_y"},
    # The principal-component cut depends on the variance spectrum, which invertible maps change.
    "svcca": COMMON | {"orthogonal", "orthogonal_y"},
    # Weights sum over x's neurons: anything done to y's neurons is invisible, x's are not.
    "pwcca": COMMON | {"orthogonal_y", "invertible_y"},
    "mean_cca": set(TRANSFORMS),
    "neuronsim": COMMON | {"neuron_scale"},
    "mixedsim": COMMON | {"neuron_scale", "orthogonal_y", "invertible_y"},
    "procrustes": COMMON | {"orthogonal", "orthogonal_y"},
    "shape_metric": COMMON | {"orthogonal", "orthogonal_y"},  # alpha = 1, procrustes
    # rsatoolbox's correlation RDM centres each example's row across neurons: a rotation or a different shift
    # per neuron moves those means.
    "rsa": {"isotropic_scale", "permutation"},
    "knn_jaccard": COMMON | {"orthogonal", "orthogonal_y"},
    # Székely et al.'s Theorem 3: x → a + b x C, C orthogonal, on either side.
    "distance_correlation": COMMON | {"orthogonal", "orthogonal_y"},
    # Euclidean distances do not see rotations or translations; a scale of one side changes them.
    "rsm_norm": {"translation", "permutation", "orthogonal", "orthogonal_y"},
    # Cosines of rows as given: a translation moves every one of them.
    "mutual_knn": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},
    "rank_similarity": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},
    "second_order_cosine": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},
    "cknna": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},
    # ReSi's (their declarations, checked here; docs/peers.md lists where ReSi's own flags are wrong). The
    # regressand x's neurons are weighted by their variance: a map of x (or its neurons' scales) moves R².
    "linear_regression": COMMON | {"orthogonal", "orthogonal_y", "invertible_y"},
    "size_and_shape": {"translation", "permutation", "orthogonal", "orthogonal_y"},  # sizes are compared
    "aligned_cosine": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},  # raw rows: no centring
    "hard_correlation_match": COMMON,  # signed correlations: neuron_scale's sign flips move it
    "soft_correlation_match": COMMON,
    "gulp": set(TRANSFORMS),  # ridge 0: the spans only
    "eigenspace_overlap": set(TRANSFORMS),
    "magnitude_difference": {"permutation", "orthogonal", "orthogonal_y"},
    "concentricity_difference": {"isotropic_scale", "permutation", "orthogonal", "orthogonal_y"},
    "uniformity_difference": {"translation", "permutation", "orthogonal", "orthogonal_y"},
}
NEIGHBOURHOODS = {"knn_jaccard", "mutual_knn", "rank_similarity", "second_order_cosine", "cknna"}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("name", NAMES)
def test_invariances(rng, name, transform):
    x, y = _pair(rng)
    if name in NEIGHBOURHOODS - {"knn_jaccard"}:  # cosines of rows as given: _pair's offsets put them all near 1
        x = x - x.mean(axis=0)
    if name in NEIGHBOURHOODS:  # _pair's neighbourhoods barely overlap (0.03, chance level): a closer y
        y = x @ rng.normal(size=(x.shape[1], 8)) + 0.5 * rng.normal(size=(len(x), 8)) - 1.0
    if name == "uniformity_difference":  # _pair's rows are so far apart that every exp(-2 d²) underflows: closer ones
        x, y = 0.1 * x, 0.1 * y
    base = similarity(name, x, y)
    assert 0.05 < base < 0.99  # a value where a mistake could show
    changed = similarity(name, *TRANSFORMS[transform](rng, x, y))
    if transform in INVARIANT[name]:
        assert changed == pytest.approx(base, abs=1e-9)
    else:
        assert abs(changed - base) > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_symmetry_as_registered(rng, name):
    x, y = _pair(rng, n=100)
    forward, backward = similarity(name, x, y), similarity(name, y, x)
    if get_measure(name).symmetric:
        assert forward == pytest.approx(backward, abs=1e-12)
    else:
        assert abs(forward - backward) > 1e-3


def test_independent_data_is_near_zero(rng):
    """Large-n independent data; each bound is a small multiple of the measure's known bias."""
    n, p, q = 4000, 5, 7
    x, y = rng.normal(size=(n, p)), rng.normal(size=(n, q))
    # Linear CKA ≈ ||XᵀY||² / (||XᵀX|| ||YᵀY||) ≈ n p q / (n √p · n √q) = √(pq)/n;
    # debiased CKA is centred on 0 with about the same spread.
    assert 0 < linear_cka(x, y) < 4 * np.sqrt(p * q) / n
    assert abs(debiased_cka(x, y)) < 4 * np.sqrt(p * q) / n
    # E[Σ ρ²] = pq/(n-1) for independent data, so mean R²_CCA ≈ max(p, q)/(n-1); mean ρ ≤ its root.
    assert mean_cca_r2(x, y) < 2 * max(p, q) / (n - 1)
    assert svcca(x, y) < np.sqrt(2 * max(p, q) / (n - 1))
    # PWCCA is a weighted mean of the ρ's, all ≲ (√p + √q)/√n (the largest canonical correlation).
    assert pwcca(x, y) < 1.5 * (np.sqrt(p) + np.sqrt(q)) / np.sqrt(n)
    # The max of q |N(0, 1/n)| correlations ≈ √(2 ln(2q) / n); in-sample R² of q regressors ≈ q/(n-1).
    assert neuronsim(x, y) < 1.5 * np.sqrt(2 * np.log(2 * q) / n)
    assert mixedsim(x, y) < 1.5 * np.sqrt(q / (n - 1))
    # RBF kernels have many effective dimensions, so the bias is larger: ~0.007 here (empirical bound).
    assert 0 < rbf_cka(x[:1500], y[:1500]) < 0.02


def test_debiasing_removes_the_small_sample_bias(rng):
    # 40 examples of 30 independent neurons each: plain CKA is far from 0, debiased CKA is not.
    x, y = rng.normal(size=(40, 30)), rng.normal(size=(40, 30))
    assert linear_cka(x, y) > 0.4
    assert abs(debiased_cka(x, y)) < 0.1


def test_float32_matches_float64(rng):
    x, y = _pair(rng, n=150)
    for name in NAMES:
        assert similarity(name, x.astype(np.float32), y.astype(np.float32)) == pytest.approx(
            similarity(name, x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)),
            abs=1e-12,
        )


# --- numerics of the CCA family ---


@pytest.mark.parametrize("case", ["full_rank", "duplicated", "dependent", "wide"])
def test_qr_and_svd_cca_agree(rng, case):
    x, y = _pair(rng, n=80)
    if case == "duplicated":
        x = np.column_stack([x, x[:, :3]])  # rank 6 in 9 columns
    elif case == "dependent":
        y = np.column_stack([y, y @ rng.normal(size=(8, 4))])  # 4 exact linear combinations
    elif case == "wide":
        x, y = rng.normal(size=(20, 30)), rng.normal(size=(20, 25))  # more neurons than examples
    by_svd = canonical_correlations(x, y, method="svd")
    by_qr = canonical_correlations(x, y, method="qr")
    assert by_svd.shape == by_qr.shape
    np.testing.assert_allclose(by_svd, by_qr, rtol=0, atol=1e-9)
    assert np.all(np.isfinite(by_svd)) and np.all((by_svd >= 0) & (by_svd <= 1))
    for fn in (pwcca, mean_cca_r2):
        assert fn(x, y, method="qr") == pytest.approx(fn(x, y, method="svd"), abs=1e-9)
    if case != "wide":
        assert mixedsim(x, y, method="qr") == pytest.approx(mixedsim(x, y, method="svd"), abs=1e-9)


def test_rank_deficiency_is_dropped_not_divided_by(rng):
    x, y = _pair(rng, n=100)
    redundant = np.column_stack([x, x[:, :2] * 2.0, x @ rng.normal(size=(6, 3))])  # still rank 6
    assert canonical_correlations(redundant, y).shape == (6,)
    np.testing.assert_allclose(canonical_correlations(redundant, y), canonical_correlations(x, y), atol=1e-9)
    assert mean_cca_r2(redundant, y) == pytest.approx(mean_cca_r2(x, y), abs=1e-9)
    assert svcca(redundant, y, 1.0) == pytest.approx(svcca(x, y, 1.0), abs=1e-9)
    assert mixedsim(y, redundant) == pytest.approx(mixedsim(y, x), abs=1e-9)


def test_more_dimensions_than_examples_saturates_without_nan(rng):
    # 20 examples span only 19 centred directions: 30 neurons on each side fill them all, so every
    # canonical correlation is 1 (the documented small-n degeneracy), never NaN or above 1.
    x, y = rng.normal(size=(20, 30)), rng.normal(size=(20, 30))
    rho = canonical_correlations(x, y)
    assert rho.shape == (19,)
    np.testing.assert_allclose(rho, 1.0, atol=1e-9)
    for name in ("pwcca", "mean_cca", "linear_cka", "rbf_cka", "debiased_cka", "neuronsim", "svcca"):
        value = similarity(name, x, y)
        assert np.isfinite(value) and -1.0 <= value <= 1.0


def test_svcca_threshold_one_is_plain_cca(rng):
    x, y = _pair(rng)
    assert svcca(x, y, variance_threshold=1.0) == pytest.approx(canonical_correlations(x, y).mean(), abs=1e-12)
    assert svcca(x, y, variance_threshold=0.5) != pytest.approx(svcca(x, y, variance_threshold=1.0), abs=1e-3)


def test_pwcca_variance_threshold_is_wu_variant(rng):
    # Wu et al.'s pwsim: PWCCA on the SVCCA-reduced data.
    x, y = _pair(rng, n=150)
    u, s, _ = np.linalg.svd(x - x.mean(0), full_matrices=False)
    kx = int(np.searchsorted(np.cumsum(s**2) / np.sum(s**2), 0.9)) + 1
    v, t, _ = np.linalg.svd(y - y.mean(0), full_matrices=False)
    ky = int(np.searchsorted(np.cumsum(t**2) / np.sum(t**2), 0.9)) + 1
    rho, h = _ref_cca(u[:, :kx] * s[:kx], v[:, :ky] * t[:ky])
    alpha = np.abs(h.T @ (x - x.mean(0))).sum(axis=1)
    assert pwcca(x, y, variance_threshold=0.9) == pytest.approx(alpha @ rho / alpha.sum(), abs=1e-10)


# --- all-pairs matrices ---


@pytest.mark.parametrize("name", NAMES)
def test_matrix_entries_equal_pair_functions(rng, name):
    xs = _layers(rng, 60, [5, 7, 4, 6])
    ys = _layers(rng, 60, [3, 8, 5])
    full = similarity_matrix(name, xs, ys)
    assert full.shape == (4, 3)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            assert full[i, j] == pytest.approx(similarity(name, x, y), abs=1e-10)
    square = similarity_matrix(name, xs)
    assert square.shape == (4, 4)
    assert np.all(np.diag(square) == 1.0)
    for i, x in enumerate(xs):
        for j, y in enumerate(xs):
            assert square[i, j] == pytest.approx(similarity(name, x, y), abs=1e-10)
    lo, hi = get_measure(name).bounded
    assert np.all((full >= lo) & (full <= hi)) and np.all((square >= lo) & (square <= hi))
    if get_measure(name).symmetric:
        assert np.array_equal(square, square.T)
    else:
        assert not np.allclose(square, square.T, atol=1e-3)


OPTION_EXAMPLES = {
    "linear_cka": {"method": "gram"},
    "rbf_cka": {"sigma_scale": 2.0, "exact_max_rows": 20, "landmarks": 30, "landmark_seed": 1},
    "debiased_cka": {"method": "feature"},
    "svcca": {"variance_threshold": 0.9, "rtol": 1e-8, "max_dims": 3},
    "pwcca": {"method": "svd", "rtol": 1e-8, "variance_threshold": 0.9, "max_dims": None},
    "mean_cca": {"method": "qr", "rtol": 1e-8, "max_dims": 4},
    "neuronsim": {},
    "mixedsim": {"method": "qr", "rtol": 1e-8},
    "procrustes": {},
    "shape_metric": {"alpha": 0.3},
    "rsa": {"rdm": "euclidean", "compare": "pearson"},
    "knn_jaccard": {"k": 5, "metric": "euclidean"},
    "distance_correlation": {},
    "rsm_norm": {},
    "mutual_knn": {"k": 5},
    "rank_similarity": {"k": 5},
    "second_order_cosine": {"k": 5},
    "cknna": {"k": 5},
    "linear_regression": {"method": "qr", "rtol": 1e-8},
    "size_and_shape": {},
    "aligned_cosine": {},
    "hard_correlation_match": {},
    "soft_correlation_match": {},
    "gulp": {"ridge": 0.1, "rtol": 1e-8},
    "eigenspace_overlap": {"method": "qr", "rtol": 1e-8},
    "magnitude_difference": {},
    "concentricity_difference": {},
    "uniformity_difference": {},
}


@pytest.mark.parametrize("name", NAMES)
def test_pair_and_matrix_accept_the_same_options(rng, name):
    assert set(OPTION_EXAMPLES[name]) == set(get_measure(name).options)
    x, y = _pair(rng, n=50)
    options = OPTION_EXAMPLES[name]
    assert similarity(name, x, y, **options) == pytest.approx(
        similarity_matrix(name, [x], [y], **options)[0, 0], abs=1e-12
    )


def test_linear_cka_delegates_to_cka_matrix(rng):
    xs = _layers(rng, 30, [5, 40, 6])
    gram = similarity_matrix("linear_cka", xs, method="gram")
    feature = similarity_matrix("linear_cka", xs, method="feature")
    np.testing.assert_allclose(gram, feature, rtol=0, atol=1e-10)  # sample space = feature space


@pytest.mark.parametrize("n", [12, 200])  # fewer examples than neurons, and more
def test_debiased_cka_sample_and_feature_space_agree(rng, n):
    xs = _layers(rng, n, [20, 35, 7])
    gram = kernels.debiased_cka_matrix(xs, method="gram")
    feature = kernels.debiased_cka_matrix(xs, method="feature")
    np.testing.assert_allclose(gram, feature, rtol=0, atol=1e-10)
    assert gram[0, 1] == pytest.approx(_ref_debiased_cka(xs[0], xs[1]), abs=1e-9)
    np.testing.assert_allclose(kernels.debiased_cka_matrix(xs, xs[:2], method="gram"), feature[:, :2], atol=1e-10)


@pytest.mark.parametrize(
    "name, module, function",
    [("svcca", cca, "whiten"), ("pwcca", cca, "whiten"), ("mean_cca", cca, "whiten"),
     ("neuronsim", neurons, "standardise"), ("rbf_cka", kernels, "centred_rbf_kernel")],
)
def test_per_layer_statistics_computed_once(rng, monkeypatch, name, module, function):
    calls = []
    original = getattr(module, function)

    def counting(layer_name, *args, **kwargs):
        calls.append(layer_name)
        return original(layer_name, *args, **kwargs)

    monkeypatch.setattr(module, function, counting)
    xs = _layers(rng, 40, [4, 4, 4, 4, 4])
    similarity_matrix(name, xs)
    assert sorted(calls) == [f"xs[{i}]" for i in range(5)]
    calls.clear()
    similarity_matrix(name, xs, xs[:2])
    assert len(calls) == 7


# --- degenerate inputs ---


@pytest.mark.parametrize("name", NAMES)
def test_constant_representation_is_an_error(rng, name):
    varied = rng.normal(size=(13, 3))
    constant = np.tile([1234.567, 0.1, -7.0], (13, 1))
    _raises(similarity, name, varied, constant, message="y is constant across examples")
    _raises(similarity, name, constant.astype(np.float32), varied, message="x is constant across examples")
    _raises(similarity_matrix, name, [varied, varied[::-1], constant], message="xs[2] is constant across examples")


@pytest.mark.parametrize("name", NAMES)
def test_a_constant_neuron_is_defined_and_finite(rng, name):
    x, y = _pair(rng, n=100)
    with_constant = np.column_stack([x[:, :3], np.full(100, 4.2), x[:, 3:]])
    value = similarity(name, with_constant, y)
    assert np.isfinite(value)
    if name in ("neuronsim", "mixedsim", "svcca", "pwcca", "mean_cca"):
        # Dropped (neuron measures) or a zero direction that CCA never sees.
        assert value == pytest.approx(similarity(name, x, y), abs=1e-10)


def test_neuron_scores_leave_out_constant_neurons(rng):
    x, y = _pair(rng, n=100)
    x = np.column_stack([np.zeros(100), x, np.ones(100)])
    scores = neuronsim_per_neuron(x, y)
    assert scores.neurons.tolist() == list(range(1, 7))
    assert scores.values.mean() == pytest.approx(neuronsim(x, y), abs=1e-14)
    corr = np.corrcoef(x[:, 1:7].T, y.T)[:6, 6:]
    np.testing.assert_allclose(scores.values, np.abs(corr).max(axis=1), atol=1e-12)
    assert scores.matches.tolist() == np.abs(corr).argmax(axis=1).tolist()
    mixed = mixedsim_per_neuron(x, y)
    assert mixed.neurons.tolist() == list(range(1, 7)) and mixed.matches is None


def test_debiased_cka_needs_four_examples(rng):
    _raises(debiased_cka, rng.normal(size=(3, 2)), rng.normal(size=(3, 2)),
            message="x has shape (3, 2); debiased CKA needs at least 4 rows (examples)")
    assert np.isfinite(debiased_cka(rng.normal(size=(4, 2)), rng.normal(size=(4, 3))))


def test_mixedsim_refuses_an_exact_fit(rng):
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 9))  # y spans all 9 centred directions
    text = _raises(mixedsim, x, y, message="mixedsim cannot be computed on n = 10 examples with y of width d = 9")
    assert "R² = 1" in text and "use at least 11 examples" in text and "extract.max_examples" in text
    assert "another measure" in text
    assert np.isfinite(mixedsim(y, x))  # the other direction is fine
    assert np.isfinite(mixedsim(x, y[:, :8]))  # n = d + 2 is the smallest allowed
    _raises(mixedsim_per_neuron, x, y, message="with y of width d = 9")
    _raises(similarity_matrix, "mixedsim", [x, y], message="with xs[1] of width d = 9")
    _raises(similarity_matrix, "mixedsim", [y], [x, y], message="with ys[1] of width d = 9")
    assert np.isfinite(similarity_matrix("mixedsim", [y], [x])).all()
    # Judged on the width: a wide y with linearly dependent neurons is refused too (drop them first).
    _raises(mixedsim, x, np.column_stack([x, x, x]), message="with y of width d = 9")


def test_mixedsim_size_check_runs_before_any_work(rng, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("per-layer statistics computed before the size check")

    monkeypatch.setattr(neurons, "whiten", boom)
    monkeypatch.setattr(neurons, "standardise", boom)
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 12))
    _raises(mixedsim, x, y, message="mixedsim cannot be computed")
    _raises(mixedsim_per_neuron, x, y, message="mixedsim cannot be computed")
    _raises(similarity_matrix, "mixedsim", [x, y], message="mixedsim cannot be computed")


def test_check_computable_from_sizes_alone(rng):
    # The stage's and params validation's check: the same sentence as mixedsim raises on data.
    x, y = rng.normal(size=(10, 3)), rng.normal(size=(10, 9))
    with pytest.raises(LayersimError) as on_data:
        mixedsim(x, y)
    _raises(check_computable, "mixedsim", 10, {"y": 9}, message=str(on_data.value))
    text = _raises(check_computable, "mixedsim", 500, [384, 768],
                   message="mixedsim cannot be computed on n = 500 examples with a layer of width d = 768")
    assert "use at least 770 examples" in text
    assert check_computable("mixedsim", 770, [384, 768]) is None
    _raises(check_computable, "mixedsim", 769, 768, message="a layer of width d = 768")
    # The regressions on a whole layer refuse a layer as wide as the examples (test_resi_measures.py checks theirs).
    wide_refused = {"mixedsim", "linear_regression", "eigenspace_overlap"}
    for name in NAMES:  # everything else is computable at any width with enough rows
        if name not in wide_refused:
            assert check_computable(name, 20, [768, 4096]) is None
    _raises(check_computable, "debiased_cka", 3, [4], message="debiased_cka cannot be computed on n = 3 examples: "
            "it needs at least 4")
    _raises(check_computable, "svcca", 1, [4], message="svcca cannot be computed on n = 1 examples")
    _raises(check_computable, "cka", 100, [4], message="unknown similarity measure 'cka'")
    _raises(check_computable, "mixedsim", 0, [4], message="num_rows must be a positive integer, got 0.")
    _raises(check_computable, "mixedsim", 100, {"bert/2": 0},
            message="the width of bert/2 must be a positive integer, got 0.")
    assert {n for n, m in MEASURES.items() if m.check_sizes is not None} == wide_refused | {"rsa", "distance_correlation",
                                                                                          "rsm_norm"}


def test_rbf_needs_a_positive_median_distance(rng):
    x = np.zeros((9, 2))
    x[0] = 1.0  # 8 identical examples: most pairwise distances are 0
    _raises(rbf_cka, x, rng.normal(size=(9, 2)), message="x has a median pairwise distance of 0")


def test_errors_for_bad_inputs(rng):
    good = rng.normal(size=(10, 3))
    _raises(svcca, np.ones(10), good, message="x must be a 2-D (num_examples x hidden) array, got shape (10,)")
    _raises(neuronsim, good, rng.normal(size=(12, 3)), message="y has shape (12, 3) but x has shape (10, 3)")
    bad = good.copy()
    bad[2, 1] = np.nan
    _raises(pwcca, good, bad, message="y contains 1 non-finite value (NaN or inf); PWCCA needs finite activations")
    _raises(similarity_matrix, "mixedsim", good, message="got a single array of shape (10, 3)")
    _raises(similarity_matrix, "neuronsim", [good], [], message="ys is empty")


# --- registry and options ---


def test_registry_names_and_metadata():
    assert sorted(MEASURES) == ["aligned_cosine", "cknna", "concentricity_difference", "debiased_cka",
                                "distance_correlation", "eigenspace_overlap", "gulp", "hard_correlation_match",
                                "knn_jaccard", "linear_cka", "linear_regression", "magnitude_difference", "mean_cca",
                                "mixedsim", "mutual_knn", "neuronsim", "procrustes", "pwcca", "rank_similarity",
                                "rbf_cka", "rsa", "rsm_norm", "second_order_cosine", "shape_metric", "size_and_shape",
                                "soft_correlation_match", "svcca", "uniformity_difference"]
    assert {n for n, m in MEASURES.items() if not m.symmetric} == {"pwcca", "neuronsim", "mixedsim",
                                                                    "linear_regression"}
    assert MEASURES["debiased_cka"].bounded == (-1.0, 1.0)
    assert get_measure("svcca").name == "svcca"


def test_unknown_measure_and_option_errors_list_the_choices(rng):
    text = _raises(get_measure, "cosine", message="unknown similarity measure 'cosine'")
    assert all(name in text for name in MEASURES)
    _raises(similarity_matrix, "wasserstein", [rng.normal(size=(5, 2))], message="valid similarity measures are:")
    xs = [rng.normal(size=(20, 3))]
    _raises(similarity_matrix, "svcca", xs, sigma=1.0,
            message="unknown option 'sigma' for similarity measure 'svcca'; "
                    "valid options are: max_dims, rtol, variance_threshold")
    _raises(similarity_matrix, "neuronsim", xs, method="qr", message="valid options are: none (it takes no options)")
    _raises(similarity, "rbf_cka", xs[0], xs[0], threshold=2, message="valid options are: exact_max_rows, landmark_seed, landmarks, sigma_scale")
    _raises(similarity_matrix, "pwcca", xs, method="eig",
            message="unknown CCA method 'eig'; valid CCA methods are: qr, svd")
    _raises(similarity_matrix, "linear_cka", xs, method="eig", message="valid methods are: auto, feature, gram")
    _raises(svcca, xs[0], xs[0], variance_threshold=1.5, message="variance_threshold must be a number in (0, 1]")
    _raises(pwcca, xs[0], xs[0], method="qr", variance_threshold=0.9,
            message="method='qr' cannot apply a variance_threshold")
    _raises(rbf_cka, xs[0], xs[0], sigma_scale=0, message="sigma_scale must be a positive number")
    _raises(mean_cca_r2, xs[0], xs[0], rtol=2.0, message="rtol must be a number in [0, 1)")


# --- attention ---


def _random_maps(rng, lengths, heads, sharp=1.0):
    maps = []
    for t in lengths:
        logits = sharp * rng.normal(size=(heads, t, t))
        w = np.exp(logits)
        maps.append(w / w.sum(axis=2, keepdims=True))
    return maps


def test_attention_maps_from_maps_layout(rng):
    maps = _random_maps(rng, [2, 3], heads=4)
    a = AttentionMaps.from_maps(maps)
    assert a.weights.shape == (4 + 9, 4) and (a.num_heads, a.num_rows, a.num_pairs) == (4, 5, 13)
    assert a.row_starts.tolist() == [0, 2, 4, 7, 10]
    assert a.example_starts.tolist() == [0, 2]
    # Pair (example 1, query 2, key 0) of head 3.
    assert a.weights[10, 3] == maps[1][3, 2, 0]
    inferred = AttentionMaps(a.weights, a.row_starts)  # square maps: examples inferred
    assert inferred.example_row_starts().tolist() == [0, 2]


def test_attention_maps_validation(rng):
    maps = _random_maps(rng, [3, 3], heads=2)
    broken = [m.copy() for m in maps]
    broken[1][1, 2] *= 0.5
    _raises(AttentionMaps.from_maps, broken, message="maps[1] head 1 query 2 sums to")
    _raises(AttentionMaps.from_maps, [maps[0], maps[1][:1]], message="maps[1] has 1 heads but maps[0] has 2")
    _raises(AttentionMaps.from_maps, [maps[0][:, :2]], message="maps[0] must be a float (heads x len x len) array")
    _raises(AttentionMaps.from_maps, [], message="maps is empty")
    a = AttentionMaps.from_maps(maps)
    _raises(AttentionMaps, a.weights, a.row_starts[1:], message="row_starts must start at 0")
    _raises(AttentionMaps, a.weights * 2, a.row_starts, message="sums to 2, not 1")
    _raises(AttentionMaps, -a.weights, a.row_starts, message="must be finite and non-negative")
    odd = AttentionMaps(a.weights[:15], np.array([0, 3, 6, 9, 12]))  # 5 rows of 3 keys
    _raises(odd.example_row_starts, message="cannot be inferred as square maps")


def test_hand_computed_head_similarities():
    # One example of two tokens, one head each. Row 0: p = [1, 0] vs q = [0, 1]; row 1: both uniform.
    a = AttentionMaps.from_maps([np.array([[[1.0, 0.0], [0.5, 0.5]]])])
    b = AttentionMaps.from_maps([np.array([[[0.0, 1.0], [0.5, 0.5]]])])
    # JS(p, q) with m = [½, ½]: ½ KL(p‖m) + ½ KL(q‖m) = ½·1 + ½·1 = 1 bit; row 1 gives 0; mean 0.5.
    assert head_similarities(a, b, "jensen_shannon")[0, 0] == pytest.approx(0.5, abs=1e-15)
    # Difference [[1, -1], [0, 0]] has Frobenius norm √2.
    assert head_similarities(a, b, "matrix_norm")[0, 0] == pytest.approx(1 - np.sqrt(2), abs=1e-15)
    # Row 0 correlates at -1; row 1 (uniform) has no correlation and is left out.
    assert head_similarities(a, b, "pearson")[0, 0] == pytest.approx(-1.0, abs=1e-15)


def test_head_similarities_match_per_row_references(rng):
    maps_a = _random_maps(rng, [3, 5, 4], heads=3)
    maps_b = _random_maps(rng, [3, 5, 4], heads=2, sharp=2.0)
    a, b = AttentionMaps.from_maps(maps_a), AttentionMaps.from_maps(maps_b)
    js, pr, mn = (head_similarities(a, b, m) for m in ("jensen_shannon", "pearson", "matrix_norm"))
    for h in range(3):
        for g in range(2):
            rows_a = [row for m in maps_a for row in m[h]]
            rows_b = [row for m in maps_b for row in m[g]]
            ref_js = np.mean([jensenshannon(p, q, base=2) ** 2 for p, q in zip(rows_a, rows_b)])
            ref_pr = np.mean([pearsonr(p, q).statistic for p, q in zip(rows_a, rows_b)])
            ref_mn = np.mean([np.linalg.norm(ma[h] - mb[g]) for ma, mb in zip(maps_a, maps_b)])
            assert js[h, g] == pytest.approx(1 - ref_js, abs=1e-12)
            assert pr[h, g] == pytest.approx(ref_pr, abs=1e-12)
            assert mn[h, g] == pytest.approx(1 - ref_mn, abs=1e-12)


@pytest.mark.parametrize("measure", ["jensen_shannon", "pearson", "matrix_norm"])
def test_head_measures_identity_and_head_permutation(rng, measure):
    maps = _random_maps(rng, [4, 6, 3], heads=4)
    other = _random_maps(rng, [4, 6, 3], heads=3)
    a, b = AttentionMaps.from_maps(maps), AttentionMaps.from_maps(other)
    shuffled = AttentionMaps.from_maps([m[[2, 0, 3, 1]] for m in maps])
    # Identical distributions: JS distance 0, Pearson 1, Frobenius distance 0 — similarity 1.
    assert np.diag(head_similarities(a, a, measure)) == pytest.approx(np.ones(4), abs=1e-12)
    assert attention_similarity(a, shuffled, measure) == pytest.approx(1.0, abs=1e-12)
    base = attention_similarity(a, b, measure)
    assert base < 0.99
    assert attention_similarity(shuffled, b, measure) == pytest.approx(base, abs=1e-12)
    b_shuffled = AttentionMaps.from_maps([m[[1, 2, 0]] for m in other])
    assert attention_similarity(a, b_shuffled, measure) == pytest.approx(base, abs=1e-12)


def test_attention_similarity_matrix(rng):
    lengths = [5, 3, 4]
    layers = [AttentionMaps.from_maps(_random_maps(rng, lengths, heads=h)) for h in (2, 3, 2)]
    for measure in ("jensen_shannon", "pearson", "matrix_norm"):
        m = attention_similarity_matrix(measure, layers)
        assert np.all(np.diag(m) == 1.0)
        for i in range(3):
            for j in range(3):
                if i != j:
                    assert m[i, j] == pytest.approx(attention_similarity(layers[i], layers[j], measure), abs=1e-12)
        assert not np.allclose(m, m.T)  # mean over the first layer's heads: asymmetric
    # Distributed measures: heads are features, (query, key) pairs are points.
    for name in ("linear_cka", "svcca", "pwcca"):
        m = attention_similarity_matrix(name, layers[:2], layers[1:])
        assert m[0, 1] == pytest.approx(similarity(name, layers[0].weights, layers[2].weights), abs=1e-12)
    assert attention_similarity(layers[0], layers[1], "svcca", variance_threshold=0.9) == pytest.approx(
        svcca(layers[0].weights, layers[1].weights, 0.9), abs=1e-12
    )


def test_attention_errors(rng):
    a = AttentionMaps.from_maps(_random_maps(rng, [3, 4], heads=2))
    b = AttentionMaps.from_maps(_random_maps(rng, [4, 3], heads=2))
    _raises(attention_similarity_matrix, "pearson", [a, b], message="xs[1] and xs[0] do not cover the same")
    text = _raises(attention_similarity, a, a, "cosine", message="unknown attention similarity measure 'cosine'")
    assert all(name in text for name in ("jensen_shannon", "matrix_norm", "pearson", "linear_cka", "svcca"))
    _raises(attention_similarity, a, a, "pearson", base=2, message="unknown option 'base'")
    uniform = AttentionMaps.from_maps([np.full((2, 3, 3), 1 / 3), np.full((2, 4, 4), 0.25)])
    _raises(head_similarities, uniform, a, "pearson", message="head 0 of a is uniform (or has a single key) in every")
    _raises(attention_similarity_matrix, "jensen_shannon", [a.weights], message="xs[0] must be an AttentionMaps")


# --- localization ---


def test_mean_similarity_per_layer(rng):
    model_a = _layers(rng, 50, [4, 5, 6])
    model_b = _layers(rng, 50, [3, 4])
    layers = model_a + model_b
    means = mean_similarity_per_layer("neuronsim", [model_a, model_b])
    assert [len(m) for m in means] == [3, 2]
    for l, layer in enumerate(layers):
        others = [neuronsim(layer, other) for k, other in enumerate(layers) if k != l]
        assert np.concatenate(means)[l] == pytest.approx(np.mean(others), abs=1e-12)
    across = mean_similarity_per_layer("svcca", [model_a, model_b], include_same_model=False, variance_threshold=0.9)
    assert across[1][0] == pytest.approx(np.mean([svcca(model_b[0], x, 0.9) for x in model_a]), abs=1e-12)
    _raises(mean_similarity_per_layer, "svcca", [model_a], include_same_model=False,
            message="needs at least two models")


def test_localization_scores():
    neuron = np.array([0.3, 0.5, 0.7, 0.6])
    sv = np.array([0.4, 0.45, 0.5, 0.3])
    np.testing.assert_allclose(localization_scores(neuron, sv), neuron - sv, atol=1e-15)
    z = localization_scores(neuron, sv, standardize=True)
    zn = (neuron - neuron.mean()) / neuron.std()
    zs = (sv - sv.mean()) / sv.std()
    np.testing.assert_allclose(z, zn - zs, atol=1e-12)
    assert localization_scores(neuron * 10 + 3, sv, standardize=True) == pytest.approx(z, abs=1e-12)
    _raises(localization_scores, neuron, sv[:3], message="must be 1-D arrays of the same non-zero length")
    _raises(localization_scores, np.ones(4), sv, standardize=True,
            message="neuronsim_per_layer is constant across layers")


def test_one_layers_attention_maps_where_a_list_is_meant_is_one_sentence(rng):
    """Issue 49: one AttentionMaps passed for the layers' list was a TypeError from list()."""
    from layersim.similarity import attention_similarity_matrix

    one = AttentionMaps.from_maps(_random_maps(rng, [3, 3], heads=2))
    _raises(attention_similarity_matrix, "jensen_shannon", one,
            message="xs must be a sequence of AttentionMaps, one per layer, got one AttentionMaps; wrap it in a list")
    _raises(attention_similarity_matrix, "jensen_shannon", [one], one, message="ys must be a sequence of AttentionMaps")
    assert attention_similarity_matrix("jensen_shannon", [one]).shape == (1, 1)
