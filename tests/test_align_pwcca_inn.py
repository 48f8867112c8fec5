"""The PWCCA map (canonical directions weighted by their importance to X) and the INN's two starts
(identity, as Ren et al.'s INN trained from scratch, or the least-squares fit): issue 38, item 2."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from layersim.align import CCAMap, INNMap, LinearRegressionMap, PWCCAMap, mse, synthetic_recovery
from layersim.align.neural import LINEAR_INITS
from layersim.experiments.align import method_options
from layersim.params import AlignParams, Params
from layersim.similarity import pwcca

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _equally_important(n: int = 300, thetas=(0.2, 0.7, 1.1, 1.4)) -> tuple[np.ndarray, np.ndarray]:
    """x: orthogonal, centred columns of equal norm; y_j = cos θ_j x_j + sin θ_j z_j with z orthogonal to x and
    to each other. The canonical directions are then the coordinate axes (ρ_j = cos θ_j, distinct), and each
    canonical variate is one neuron of x, so every α_i = Σ_j |⟨p_i, x_j⟩| is that neuron's norm: all equal."""
    rng = np.random.default_rng(3)
    d = len(thetas)
    raw = rng.normal(size=(n, 2 * d))
    q = np.linalg.qr(raw - raw.mean(0))[0] * np.sqrt(n)
    x, z = q[:, :d], q[:, d:]
    y = x * np.cos(thetas) + z * np.sin(thetas)
    return 3.0 * x + 1.0, 0.5 * y - 2.0


def _one_factor(seed: int = 0, n: int = 400, d: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """One latent factor loaded on every neuron of x (plus independent noise per neuron) drives y. The
    canonical direction of the factor is strongly correlated (ρ ≈ 0.98) and carries every neuron of x
    (important); the other nine pair x's per-neuron noise with y's (ρ ≤ 0.45) and each carries little."""
    rng = np.random.default_rng(seed)
    factor = rng.normal(size=(n, 1))
    x = factor @ rng.normal(size=(1, d)) * 2 + rng.normal(size=(n, d))
    y = factor @ rng.normal(size=(1, d)) + 0.5 * rng.normal(size=(n, d))
    return x, y


def test_pwcca_map_is_the_cca_map_when_every_direction_is_equally_important():
    x, y = _equally_important()
    for scale in (False, True):
        pw = PWCCAMap(scale_by_correlation=scale).fit(x, y)
        cca = CCAMap(scale_by_correlation=scale).fit(x, y)
        np.testing.assert_allclose(pw.correlations_, np.cos([0.2, 0.7, 1.1, 1.4]), atol=1e-12)
        np.testing.assert_allclose(pw.importance_, np.ones(4), atol=1e-12)
        np.testing.assert_allclose(pw.projection_weights_, np.full(4, 0.25), atol=1e-12)
        np.testing.assert_allclose(pw.matrix_, cca.matrix_, atol=1e-12)
        np.testing.assert_allclose(pw.transform(x), cca.transform(x), atol=1e-12)


def test_pwcca_map_weights_each_canonical_variate_by_its_projection_weight():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5)) * rng.uniform(0.5, 3.0, size=5) + 4.0
    y = np.tanh(x @ rng.normal(size=(5, 4)) / 3) + 0.5 * rng.normal(size=(200, 4))
    pw, cca = PWCCAMap().fit(x, y), CCAMap().fit(x, y)
    centred = x - x.mean(0)
    p = cca.x_scaler_.transform(x) @ cca.x_directions_  # unit-norm canonical variates p_i (Ren eq. 9)
    alpha = np.abs(p.T @ centred).sum(axis=1)  # eq. 8 over x's centred neurons x_j
    np.testing.assert_allclose(pw.projection_weights_, alpha / alpha.sum(), rtol=1e-10)
    # The map's weights: eq. 8 over the standardised neurons it acts on.
    standardised = np.abs(p.T @ (centred / x.std(axis=0))).sum(axis=1)
    np.testing.assert_allclose(pw.importance_, standardised / standardised.max(), rtol=1e-10)
    np.testing.assert_allclose(pw.matrix_, (cca.x_directions_ * standardised / standardised.max()) @ cca.y_loadings_,
                               atol=1e-10)
    assert pw.similarity_ == pytest.approx(alpha @ cca.correlations_ / alpha.sum(), rel=1e-12)  # eq. 7
    # The weights are the pwcca similarity measure's (the same code): its value, uncapped, is the map's.
    assert pw.similarity_ == pytest.approx(pwcca(x, y, max_dims=None), rel=1e-12)
    assert np.abs(pw.matrix_ - cca.matrix_).max() > 0.05  # unequal weights: a different map


def test_pwcca_beats_cca_held_out_where_the_important_directions_are_the_correlated_ones():
    # CCA transfers every canonical variate of x at full scale (ω = 1), also the nine noise pairs whose
    # correlation is weak (and, fitted on 200 rows, partly spurious): on held-out rows each is uncorrelated with its
    # y variate, so it adds its variance as error a second time, and together they hold y's per-neuron noise
    # (variance 0.25) in the nine directions besides the factor's. PWCCA shrinks each to α_i / max α ≈ 0.15 of it,
    # towards y's mean, and keeps the factor's direction (α = max) at full scale: near the best predictor.
    n, d, noise = 400, 10, 0.5
    x, y = _one_factor(n=n, d=d)
    rng = np.random.default_rng(0)  # _one_factor's draws again: the factor, x's loadings, x's noise, y's loadings
    rng.normal(size=(n, 1))
    x_loadings = 2 * rng.normal(size=d)
    rng.normal(size=(n, d))
    y_loadings = rng.normal(size=d)
    train, test = slice(0, 200), slice(200, None)
    # The best predictor: E[y | x] = y_loadings E[factor | x], where E[factor | x] = x·a / (1 + |a|²) for
    # x = a factor + N(0, I).
    oracle = mse(np.outer(x[test] @ x_loadings / (1 + x_loadings @ x_loadings), y_loadings), y[test])
    pw, cca = PWCCAMap().fit(x[train], y[train]), CCAMap().fit(x[train], y[train])
    assert pw.correlations_[0] > 0.95 and pw.correlations_[1:].max() < 0.5
    assert pw.importance_[0] == 1.0 and pw.importance_[1:].max() < 0.25
    pw_error, cca_error = mse(pw.transform(x[test]), y[test]), mse(cca.transform(x[test]), y[test])
    assert pw_error < 0.7 * cca_error
    # PWCCA: the best predictor's error plus an estimation error of least squares' order (d / (rows - d - 1) of it
    # in expectation), here allowed twice that.
    assert oracle < pw_error < oracle * (1 + 2 * d / (200 - d - 1))
    # CCA: the best predictor's error plus y's noise in the nine other directions, per neuron, within 8 %.
    assert cca_error == pytest.approx(oracle + noise**2 * (d - 1) / d, rel=0.08)
    least_squares = mse(LinearRegressionMap().fit(x[train], y[train]).transform(x[test]), y[test])
    assert pw_error < 1.05 * least_squares


def test_rescaling_one_neuron_of_x_changes_no_linear_maps_predictions():
    """The maps act on standardised X: a neuron 100× larger (BERT's outlier dimensions) changes nothing, PWCCA's
    weights included (in X's own units that neuron alone would set them)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8))
    y = np.tanh(x @ rng.normal(size=(8, 5)) / 3) + 0.5 * rng.normal(size=(300, 5))
    louder = x.copy()
    louder[:, 0] *= 100.0
    for make in (PWCCAMap, CCAMap, LinearRegressionMap, lambda: CCAMap(scale_by_correlation=True)):
        before, after = make().fit(x[:200], y[:200]), make().fit(louder[:200], y[:200])
        np.testing.assert_allclose(after.transform(louder[200:]), before.transform(x[200:]), atol=1e-9)
    assert np.ptp(PWCCAMap().fit(x, y).importance_) > 0.05  # unequal weights: the check is not CCA's again


FAST_INN = {"depth": 2, "hidden": 16, "steps": 3, "batch_size": 512}


def _start(inn: INNMap, x: np.ndarray, y: np.ndarray) -> tuple[torch.nn.Module, np.ndarray, np.ndarray]:
    """The network an INNMap starts training from, its (whitened) input rows and the standardised x."""
    xs, ys = inn._prepare(x, y)
    (rows, ys), = INNMap._network_inputs([inn], [(xs, ys)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(inn.seed)
        return inn._build(rows, ys), rows, xs


@pytest.mark.parametrize("whiten", [False, True])
def test_identity_start_maps_x_to_x_before_training(whiten):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(120, 6)) @ rng.normal(size=(6, 6)) + 3.0
    y = np.tanh(x) @ rng.normal(size=(6, 6))
    network, rows, xs = _start(INNMap(whiten=whiten, **FAST_INN), x, y)
    with torch.no_grad():
        out = network(torch.from_numpy(rows.astype(np.float32))).double().numpy()
    if whiten:  # the linear layer undoes the whitening, to float32 rounding of its weights
        np.testing.assert_allclose(out, xs, atol=1e-5)
    else:  # identity weight, zero bias, couplings with s = t = 0: exactly x
        np.testing.assert_array_equal(out, xs.astype(np.float32).astype(np.float64))


def test_the_two_starts_begin_at_the_identity_and_at_least_squares():
    # loss_history_[0] is the training error before the first update (the batch is every row).
    rng = np.random.default_rng(2)
    x = rng.normal(size=(150, 6)) @ rng.normal(size=(6, 6))
    y = x @ rng.normal(size=(6, 6)) + 0.1 * rng.normal(size=(150, 6))
    xs, ys = (x - x.mean(0)) / x.std(0), (y - y.mean(0)) / y.std(0)
    identity = INNMap(**FAST_INN).fit(x, y)
    assert identity.linear_init == "identity"  # the default: Ren's INN trains from scratch
    assert identity.loss_history_[0] == pytest.approx(np.mean((xs - ys) ** 2), rel=1e-5)
    started = INNMap(linear_init="least_squares", **FAST_INN).fit(x, y)
    least_squares = np.mean((LinearRegressionMap().fit(x, y).transform(x) - y) ** 2 / y.std(0) ** 2)
    assert started.loss_history_[0] < 2 * least_squares + 1e-3  # ridge 1e-2: almost least squares
    assert started.loss_history_[0] < 0.05 * identity.loss_history_[0]
    # Learning rates of the linear layer: full from the identity, a tenth from least squares, or as given.
    assert identity._learning_rate_factor("linear.weight") == 1.0
    assert started._learning_rate_factor("linear.weight") == 0.1
    assert INNMap(linear_learning_rate_factor=0.0)._learning_rate_factor("linear.weight") == 0.0
    assert identity._learning_rate_factor("blocks.0.subnet.0.weight") == 1.0


def test_inn_init_param_reaches_the_map():
    field = {f.name: f for f in dataclasses.fields(AlignParams)}["inn_init"]
    assert field.metadata["names"] == LINEAR_INITS  # spelled out in params (no torch there): kept equal here
    for init in LINEAR_INITS:
        params = Params(model="tiny-bert", tasks=("synth-negation",), seeds=(1,), device="cpu",
                        align=AlignParams(inn_init=init))
        assert method_options(params)["inn"]["linear_init"] == init
    assert AlignParams().inn_init == "identity"


def test_identity_start_still_recovers_a_random_inn_better_than_linear():
    # The same recovery as test_align's least-squares start (0.19 there): from the identity the INN gets 0.31,
    # least squares 0.59 — a smaller lead, earned by training rather than started with.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 8)) @ rng.normal(size=(8, 8)) * rng.uniform(0.5, 3.0, size=8) + rng.normal(size=8) * 5
    result = synthetic_recovery(x, ["linear", "inn"], seed=0, depth=2, hidden=32, scale=1.0,
                                inn={"depth": 2, "hidden": 64, "steps": 400, "batch_size": 128, "learning_rate": 3e-3,
                                     "linear_init": "identity"})
    errors = {row["method"]: row["relative_error"] for row in result["rows"]}
    assert errors["inn"] < 0.6 * errors["linear"]
