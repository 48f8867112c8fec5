"""The similarity packages researchers install from PyPI as oracles: equal values where their definitions agree
with layersim's, and where they do not, the difference shown to be exactly the documented one (their value
reproduced with the other formula). Each peer is optional (the `oracles` extra of pyproject.toml, installed
with --no-deps, docs/peers.md); a test whose peer is absent is skipped.

netrep is not on PyPI; its LinearMetric's conventions (partial whitening, zero padding, rotation, angle) are
written out below from its documentation and checked against layersim.similarity.shape.
"""

from __future__ import annotations

import numpy as np
import pytest

from layersim.similarity import debiased_cka, linear_cka, rbf_cka, similarity

N = 40


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, 7))
    y = np.tanh(x @ rng.normal(size=(7, 5))) + 0.5 * rng.normal(size=(N, 5))
    return x, y


def _hsic_biased(k: np.ndarray, l: np.ndarray) -> float:
    """Gretton et al.'s tr(K H L H) / (n − 1)²."""
    n = len(k)
    h = np.eye(n) - 1.0 / n
    return float(np.trace(k @ h @ l @ h)) / (n - 1) ** 2


def _hsic_unbiased(k: np.ndarray, l: np.ndarray) -> float:
    """Song et al. 2012's unbiased estimator (diagonals zeroed)."""
    n = len(k)
    k, l = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    return float((np.sum(k * l) + k.sum() * l.sum() / ((n - 1) * (n - 2)) - 2 / (n - 2) * k.sum(0) @ l.sum(0))
                 / (n * (n - 3)))


def _linear(a: np.ndarray) -> np.ndarray:
    c = a - a.mean(0)
    return c @ c.T


def _rbf(a: np.ndarray, rule: str) -> np.ndarray:
    """RBF kernel, σ = the median distance between distinct examples (layersim, repsim; an even count's two
    middle values averaged) or σ² = the median of all n² squared distances, the diagonal's zeros included
    (ckatorch)."""
    sq = np.sum(a * a, 1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * a @ a.T, 0)
    np.fill_diagonal(d2, 0)
    if rule == "pairs":
        sigma2 = np.median(np.sqrt(d2[np.triu_indices(len(a), 1)])) ** 2
    else:  # torch.median of an even count: the lower of the two middle values
        sigma2 = np.sort(d2.ravel())[(d2.size - 1) // 2]
    return np.exp(-d2 / (2 * sigma2))


def _cka(k, l, hsic):
    return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


# --- repsim (Kisung You; C++ core) ---


def test_repsim_linear_and_rbf_cka_are_layersims(pair):
    repsim = pytest.importorskip("repsim")
    x, y = pair
    assert repsim.cka([x, y], "linear", "gretton")[0, 1] == pytest.approx(linear_cka(x, y), abs=1e-12)
    # RBF with the median rule: σ = the median distance between distinct examples, as layersim's rbf_cka.
    assert repsim.cka([x, y], "rbf", "gretton")[0, 1] == pytest.approx(rbf_cka(x, y), abs=1e-12)


def test_repsim_song_divides_the_unbiased_hsic_by_biased_self_hsics(pair):
    """repsim's "song" CKA is HSIC_u(K, L) / sqrt(HSIC_b(K, K) HSIC_b(L, L)), not debiased CKA's
    HSIC_u / sqrt(HSIC_u HSIC_u): reproduced exactly, and the same formula with unbiased self terms is layersim's."""
    repsim = pytest.importorskip("repsim")
    x, y = pair
    k, l = _linear(x), _linear(y)
    song = repsim.cka([x, y], "linear", "song")[0, 1]
    assert song == pytest.approx(_hsic_unbiased(k, l) / np.sqrt(_hsic_biased(k, k) * _hsic_biased(l, l)), abs=1e-12)
    assert _cka(k, l, _hsic_unbiased) == pytest.approx(debiased_cka(x, y), abs=1e-12)
    assert abs(song - debiased_cka(x, y)) > 1e-3


# --- ckatorch ---


def _ckatorch(x, y, **options) -> float:
    torch = pytest.importorskip("torch")
    ckatorch = pytest.importorskip("ckatorch")
    return float(ckatorch.cka_base(torch.from_numpy(x), torch.from_numpy(y), **options))


def test_ckatorch_linear_and_debiased_cka_are_layersims(pair):
    x, y = pair
    assert _ckatorch(x, y, kernel="linear") == pytest.approx(linear_cka(x, y), abs=1e-12)
    assert _ckatorch(x, y, kernel="linear", unbiased=True) == pytest.approx(debiased_cka(x, y), abs=1e-12)


def test_ckatorch_rbf_bandwidth_is_the_median_of_all_n2_squared_distances(pair):
    """ckatorch's σ² is torch.median over all n² squared distances, the diagonal's zeros included: the same
    RBF CKA with that rule gives its value, with the distinct pairs' rule layersim's."""
    x, y = pair
    ours = _cka(_rbf(x, "pairs"), _rbf(y, "pairs"), _hsic_biased)
    assert ours == pytest.approx(rbf_cka(x, y), abs=1e-12)
    theirs = _ckatorch(x, y, kernel="rbf")
    assert theirs == pytest.approx(_cka(_rbf(x, "all"), _rbf(y, "all"), _hsic_biased), abs=1e-12)
    assert abs(theirs - ours) > 1e-4


# --- rsatoolbox ---


@pytest.mark.parametrize("rdm", ["correlation", "euclidean"])
@pytest.mark.parametrize("compare", ["spearman", "pearson", "cosine"])
def test_rsa_is_rsatoolbox_compare(pair, rdm, compare):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    from layersim.similarity.rsa import RSATOOLBOX_NAMES

    x, y = pair
    rdms = [rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(a), method=rdm) for a in (x, y)]
    theirs = rsatoolbox.rdm.compare(*rdms, method=RSATOOLBOX_NAMES[compare])[0, 0]
    assert similarity("rsa", x, y, rdm=rdm, compare=compare) == pytest.approx(theirs, abs=1e-12)


def test_rsa_rdms_are_rsatoolboxs(pair):
    rsatoolbox = pytest.importorskip("rsatoolbox")
    from layersim.similarity.rsa import rdm

    x = pair[0]
    for kind in ("correlation", "euclidean"):
        theirs = rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(x), method=kind).get_matrices()[0]
        np.testing.assert_allclose(rdm("x", x, kind), theirs, atol=1e-12)


# --- netrep's LinearMetric, written out ---


def _netrep_angle(x: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """netrep's LinearMetric(alpha, center_columns=True, zero_pad=True, score_method="angular").fit_score:
    zero-pad the narrower side, centre, whiten partially with the total variance kept (eigenvalues of XᵀX
    clipped at 1e-7; no whitening for alpha > 1 − 1e-7), rotate both onto each other with the SVD of X̃ᵀỸ,
    and return the angle between the aligned matrices."""
    width = max(x.shape[1], y.shape[1])
    x, y = (np.pad(a - a.mean(0), ((0, 0), (0, width - a.shape[1]))) for a in (x, y))

    def whiten(a):
        if alpha > 1 - 1e-7:
            return a
        lam, v = np.linalg.eigh(a.T @ a)
        lam = np.maximum(lam, 1e-7)
        d = alpha + (1 - alpha) / np.sqrt(lam)
        d *= np.sqrt(lam.sum() / np.sum(alpha ** 2 * lam + 2 * alpha * (1 - alpha) * np.sqrt(lam) + (1 - alpha) ** 2))
        return a @ (v * d) @ v.T

    xw, yw = whiten(x), whiten(y)
    u, _, vt = np.linalg.svd(xw.T @ yw)
    ax, ay = xw @ u, yw @ vt.T
    return float(np.arccos(np.clip(np.sum(ax * ay) / (np.linalg.norm(ax) * np.linalg.norm(ay)), -1, 1)))


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.25, 0.0])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (10.0, 1.0), (0.01, 300.0)])
def test_the_shape_metric_is_netreps_angle_on_the_data_as_given(pair, alpha, scales):
    """netrep whitens at the data's own scale; so does layersim: equal for every alpha and any scale of either side
    (at 0 < alpha < 1 the scale moves both alike)."""
    from layersim.similarity.shape import angular_shape_distance

    x, y = pair[0] * scales[0], pair[1] * scales[1]
    assert angular_shape_distance(x, y, alpha=alpha) == pytest.approx(_netrep_angle(x, y, alpha), abs=1e-9)


def test_alpha_below_one_is_refused_when_whitening_saturates():
    """With n − 1 ≤ d a fully whitened layer spans every centred direction: independent layers would score 1."""
    from layersim.errors import LayersimError
    from layersim.similarity.shape import angular_shape_distance

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 100)), rng.normal(size=(50, 100))
    assert _netrep_angle(x, y, 0.0) == pytest.approx(0.0, abs=1e-6)  # netrep's own saturation
    with pytest.raises(LayersimError, match=r"alpha = 0.5 < 1 needs more examples .* 50 rows and 100 neurons"):
        angular_shape_distance(x, y, alpha=0.5)
    assert 0 < angular_shape_distance(x, y, alpha=1.0) < np.pi / 2  # Procrustes needs no whitening
