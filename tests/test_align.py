"""Tests for the alignment maps and experiments (layersim.align; Ren et al. 2023).

The CCA-family matrices are checked against covariance formulas written here independently of the
SVD route the library takes; the neural maps on small widths so the file stays fast.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from layersim.align import (MAPS, CCAMap, CouplingFlow, INNMap, LinearRegressionMap, MLPMap, PWCCAMap, SVCCAMap,
                            alignment_errors, fit_maps, layer_alignment_matrix, make_map, map_representations, mse,
                            random_flow, relative_error, synthetic_recovery, train_test_split_rows)
from layersim.align.flows import check_loss_history
from layersim.align.neural import shrunk_whitening
from layersim.errors import LayersimError
from layersim.compute.linalg import Standardizer, thin_svd

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LINEAR_NAMES = ("linear", "cca", "svcca", "pwcca")
FAST_INN = {"depth": 2, "hidden": 32, "steps": 150, "batch_size": 128}
FAST_MLP = {"depth": 1, "hidden": 32, "steps": 150, "batch_size": 128}




@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _correlated(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Rows with correlated columns, unequal scales and an offset."""
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * rng.uniform(0.5, 3.0, size=d) + rng.normal(size=d) * 5


def _msqrt(s: np.ndarray, power: float) -> np.ndarray:
    w, v = np.linalg.eigh(s)
    return (v * w**power) @ v.T


def _standardise(a: np.ndarray) -> np.ndarray:
    return (a - a.mean(0)) / a.std(0)


def _reference_cca(xs: np.ndarray, ys: np.ndarray):
    """CCA from covariances: K = Σxx^-1/2 Σxy Σyy^-1/2 = U diag(ρ) Vᵀ, W_X = Σxx^-1/2 U, W_Y = Σyy^-1/2 V."""
    sxx, syy, sxy = xs.T @ xs, ys.T @ ys, xs.T @ ys
    u, rho, vt = np.linalg.svd(_msqrt(sxx, -0.5) @ sxy @ _msqrt(syy, -0.5))
    return _msqrt(sxx, -0.5) @ u, _msqrt(syy, -0.5) @ vt.T, rho


# --- linear family ---


@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_linear_maps_recover_exact_linear_relation(rng, name):
    # X has rank 5 inside 7 columns (orthonormal mixing: each direction >10% of the variance), so
    # SVCCA's 99% variance cut keeps all of its signal.
    n, d, k = 120, 7, 5
    x = rng.normal(size=(n, k)) @ np.linalg.qr(rng.normal(size=(d, d)))[0][:k] * 3 + rng.normal(size=d)
    y = x @ rng.normal(size=(d, 6)) + rng.normal(size=6) * 10
    fitted = make_map(name).fit(x[:80], y[:80])
    error = relative_error(fitted.transform(x[80:]), y[80:])
    if name == "pwcca":
        # Every ρ is 1, but PWCCA still shrinks the canonical variates few of x's neurons carry (by α_i / max α):
        # the price of its weighting, paid where nothing is noise.
        assert error > 0.05 and np.ptp(fitted.importance_) > 0.1
    else:
        assert error < 1e-9


@pytest.mark.parametrize("name", LINEAR_NAMES)
def test_full_rank_linear_maps_invert(rng, name):
    x = _correlated(rng, 100, 6)
    y = x @ rng.normal(size=(6, 6)) - 3.0
    fitted = make_map(name, **({"variance_threshold": 1.0} if name == "svcca" else {})).fit(x[:70], y[:70])
    # PWCCA's map does not send x onto y here (see above), but it is a bijection: its inverse undoes it.
    target = fitted.transform(x[70:]) if name == "pwcca" else y[70:]
    assert relative_error(fitted.inverse(target), x[70:]) < 1e-9


def test_cca_map_is_rens_formula_and_scaled_cca_is_least_squares(rng):
    x = _correlated(rng, 200, 5)
    y = np.tanh(x @ rng.normal(size=(5, 5)) / 5) + 0.3 * rng.normal(size=(200, 5))
    xs, ys = _standardise(x), _standardise(y)
    w_x, w_y, rho = _reference_cca(xs, ys)

    cca = CCAMap().fit(x, y)
    np.testing.assert_allclose(cca.correlations_, rho, atol=1e-10)
    # Ren eq. (6): M = W_X W_Y⁻¹ = Σxx^-1/2 U Vᵀ Σyy^1/2 (independent of the sign of each pair).
    np.testing.assert_allclose(cca.matrix_, w_x @ np.linalg.inv(w_y), atol=1e-10)
    # Canonical variates: orthonormal, cross-products diag(ρ).
    u, v = xs @ cca.x_directions_, ys @ cca.y_directions_
    np.testing.assert_allclose(u.T @ u, np.eye(5), atol=1e-10)
    np.testing.assert_allclose(u.T @ v, np.diag(rho), atol=1e-10)
    # Transform in original units: ŷ = ((x − mean_x)/std_x) M std_y + mean_y.
    expected = (x - x.mean(0)) / x.std(0) @ cca.matrix_ * y.std(0) + y.mean(0)
    np.testing.assert_allclose(cca.transform(x), expected, atol=1e-10)

    scaled = CCAMap(scale_by_correlation=True).fit(x, y)
    np.testing.assert_allclose(scaled.matrix_, w_x @ np.diag(rho) @ np.linalg.inv(w_y), atol=1e-10)
    np.testing.assert_allclose(scaled.transform(x), LinearRegressionMap().fit(x, y).transform(x), atol=1e-9)


def _cca_test_pair(rng: np.random.Generator, dx: int, dy: int, rank_x: int | None = None, n: int = 200):
    """Non-linearly related x, y with unequal scales and offsets; x of rank ``rank_x`` if given."""
    x = _correlated(rng, n, dx)
    if rank_x is not None:
        x = x[:, :rank_x] @ rng.normal(size=(rank_x, dx)) + rng.normal(size=dx)
    y = 4 * np.tanh(x @ rng.normal(size=(dx, dy)) / dx) + x @ rng.normal(size=(dx, dy)) + 2 * rng.normal(size=(n, dy))
    return x, y


@pytest.mark.parametrize("dx, dy, rank_x", [(12, 15, None), (15, 15, None), (15, 12, None), (8, 6, 5)],
                         ids=["narrower_x", "equal", "wider_x", "rank_deficient_x"])
def test_scaled_cca_with_all_components_is_least_squares(rng, dx, dy, rank_x):
    # The old map went back to Y through W_Y⁺, which is not least squares when W_Y is not square
    # (narrower or rank-deficient x): held-out MSE 32.5 against 5.44 for 12 → 15 here, 243 against
    # 6.65 for the rank-deficient x. Equal and wider x were already least squares (W_Y square).
    x, y = _cca_test_pair(rng, dx, dy, rank_x)
    train, test = slice(0, 150), slice(150, None)
    least_squares = LinearRegressionMap().fit(x[train], y[train])
    expected = least_squares.transform(x[test])
    # (PWCCA also scales each variate by its importance, so it is least squares only when all are equal.)
    for fitted in (CCAMap(scale_by_correlation=True).fit(x[train], y[train]),
                   SVCCAMap(1.0, scale_by_correlation=True).fit(x[train], y[train])):
        predicted = fitted.transform(x[test])
        assert mse(predicted, y[test]) == pytest.approx(mse(expected, y[test]), rel=1e-9)
        np.testing.assert_allclose(predicted, expected, rtol=0, atol=1e-8 * np.abs(y).max())
    if rank_x is None:  # full rank: also the same matrix (lstsq's minimum-norm M differs otherwise)
        np.testing.assert_allclose(CCAMap(scale_by_correlation=True).fit(x[train], y[train]).matrix_,
                                   least_squares.matrix_, atol=1e-9)


def test_cca_way_back_is_the_inverse_of_y_directions_when_square(rng):
    # Ren's W_Y⁻¹ exists when W_Y is square (d_y <= d_x, all components): the loadings are exactly it.
    x, y = _cca_test_pair(rng, 7, 5)
    fitted = CCAMap().fit(x, y)
    np.testing.assert_allclose(fitted.y_loadings_, np.linalg.inv(fitted.y_directions_), atol=1e-10)
    # Narrower x: W_Y is 7 x 5; the loadings are the least-squares way back from Y's canonical variates.
    x, y = _cca_test_pair(rng, 5, 7)
    fitted = CCAMap().fit(x, y)
    ys = _standardise(y)
    v = ys @ fitted.y_directions_
    np.testing.assert_allclose(fitted.y_loadings_, np.linalg.lstsq(v, ys, rcond=None)[0], atol=1e-10)


def test_cca_num_components_keeps_top_pairs(rng):
    x, y = _correlated(rng, 150, 5), _correlated(rng, 150, 4)
    y += x[:, :4]
    top2 = CCAMap(num_components=2).fit(x, y)
    w_x, w_y, rho = _reference_cca(_standardise(x), _standardise(y))
    np.testing.assert_allclose(top2.correlations_, rho[:2], atol=1e-10)
    # The way back from Y's top 2 canonical variates is their least-squares regression onto Ys.
    ys = _standardise(y)
    v2 = ys @ w_y[:, :2]
    np.testing.assert_allclose(top2.matrix_, w_x[:, :2] @ np.linalg.lstsq(v2, ys, rcond=None)[0], atol=1e-9)
    with pytest.raises(LayersimError, match="not square"):
        top2.inverse(y)
    with pytest.raises(LayersimError, match="rank 2 < 4"):
        CCAMap(num_components=2).fit(x[:, :4], y).inverse(y)


def test_pwcca_weights_by_projection_on_centred_neurons(rng):
    # The map itself (importance-weighted CCA) is tested in test_align_pwcca_inn.py.
    x = _correlated(rng, 150, 4)
    y = x @ rng.normal(size=(4, 4)) + 2.0 * rng.normal(size=(150, 4))
    pw = PWCCAMap().fit(x, y)
    xs, ys = _standardise(x), _standardise(y)
    w_x, _, rho = _reference_cca(xs, ys)
    p = xs @ w_x  # unit-norm canonical variates p_i (Ren eq. 9)
    alpha = np.abs(p.T @ (x - x.mean(0))).sum(axis=1)  # eq. 8: α_i = Σ_j |⟨p_i, x_j⟩|, x_j the centred neurons
    np.testing.assert_allclose(pw.projection_weights_, alpha / alpha.sum(), atol=1e-10)
    np.testing.assert_allclose(pw.similarity_, alpha @ rho / alpha.sum(), atol=1e-10)  # eq. 7


def test_svcca_is_cca_between_principal_subspaces(rng):
    n = 300
    # Three strong directions plus three weak ones on each side: 99% of the variance is the strong ones.
    x = np.hstack([rng.normal(size=(n, 3)) * 10, rng.normal(size=(n, 3)) * 0.05]) @ np.linalg.qr(
        rng.normal(size=(6, 6)))[0]
    y = np.hstack([x[:, :3] + rng.normal(size=(n, 3)), rng.normal(size=(n, 2)) * 0.05])
    sv = SVCCAMap(variance_threshold=0.99).fit(x, y)
    xs, ys = _standardise(x), _standardise(y)

    def principal(a, threshold):
        w, v = np.linalg.eigh(a.T @ a)
        w, v = w[::-1], v[:, ::-1]
        k = int(np.argmax(np.cumsum(w) / w.sum() >= threshold)) + 1
        return v[:, :k]

    p_x, p_y = principal(xs, 0.99), principal(ys, 0.99)
    assert sv.kept_ == (p_x.shape[1], p_y.shape[1])
    w_x, w_y, rho = _reference_cca(xs @ p_x, ys @ p_y)
    c = min(p_x.shape[1], p_y.shape[1])
    np.testing.assert_allclose(sv.correlations_, rho[:c], atol=1e-8)
    v = ys @ p_y @ w_y[:, :c]
    back = np.linalg.lstsq(v, ys @ p_y, rcond=None)[0]  # least squares from Y's canonical variates
    np.testing.assert_allclose(sv.matrix_, p_x @ w_x[:, :c] @ back @ p_y.T, atol=1e-8)
    # With every direction kept, SVCCA is CCA.
    np.testing.assert_allclose(SVCCAMap(1.0).fit(x, y).matrix_, CCAMap().fit(x, y).matrix_, atol=1e-8)


def test_ridge_shrinks_towards_the_mean(rng):
    x = _correlated(rng, 80, 5)
    y = x @ rng.normal(size=(5, 3)) + rng.normal(size=(80, 3))
    plain, ridged = LinearRegressionMap().fit(x, y), LinearRegressionMap(ridge=1e6).fit(x, y)
    assert np.abs(ridged.matrix_).max() < 1e-4 * np.abs(plain.matrix_).max()
    np.testing.assert_allclose(ridged.transform(x), np.broadcast_to(y.mean(0), y.shape), atol=1e-3 * y.std())


# --- neural maps ---


def test_inn_recovers_a_random_inn_far_better_than_linear(rng):
    # From the least-squares start; from the identity: test_align_pwcca_inn.py.
    x = _correlated(rng, 600, 8)
    result = synthetic_recovery(x, ["linear", "cca", "inn"], seed=0, depth=2, hidden=32, scale=1.0,
                                inn={"depth": 2, "hidden": 64, "steps": 400, "batch_size": 128, "learning_rate": 3e-3,
                                     "linear_init": "least_squares"})
    errors = {row["method"]: row["relative_error"] for row in result["rows"]}
    assert errors["linear"] > 0.2  # f is clearly non-linear
    assert errors["inn"] < 0.5 * errors["linear"]  # ≈ 0.19 vs 0.59 on this data
    assert errors["inn"] < 0.5 * errors["cca"]
    assert set(result["train_idx"]).isdisjoint(result["test_idx"])


def test_synthetic_recovery_uses_a_seeded_sample_of_rows(rng):
    x = _correlated(rng, 300, 6)
    fast = {"inn": {"depth": 1, "hidden": 8, "steps": 5}}
    sampled = synthetic_recovery(x, ["linear", "inn"], seed=3, rows=100, **fast)
    again = synthetic_recovery(x, ["linear", "inn"], seed=3, rows=100, **fast)
    assert sampled["num_rows"] == 100 and len(sampled["train_idx"]) + len(sampled["test_idx"]) == 100
    np.testing.assert_array_equal(sampled["y"], again["y"])
    everything = synthetic_recovery(x, ["linear"], seed=3, rows=1000)
    assert everything["num_rows"] == 300  # fewer rows than asked for: all of them
    with pytest.raises(LayersimError, match="rows must be an integer >= 3"):
        synthetic_recovery(x, ["linear"], rows=2)


def test_shrunk_whitening_whitens_and_inverts(rng):
    x = _correlated(rng, 2000, 6)
    xs = Standardizer().fit(x).transform(x)
    forward, back = shrunk_whitening(xs, shrinkage=0.0)
    np.testing.assert_allclose(np.cov(xs @ forward, rowvar=False, bias=True), np.eye(6), atol=1e-8)
    np.testing.assert_allclose(forward @ back, np.eye(6), atol=1e-10)
    constant = np.column_stack([xs, xs[:, 0] + xs[:, 1]])  # an exactly constant direction (as after LayerNorm)
    forward, back = shrunk_whitening(constant)
    assert np.abs(forward).max() <= 10.0 + 1e-9  # at most 1/sqrt(shrinkage) along it
    np.testing.assert_allclose(forward @ back, np.eye(7), atol=1e-8)


def test_inn_with_and_without_whitening_is_a_bijection_of_the_same_rows(rng):
    x = _correlated(rng, 300, 10)
    y = np.tanh(x) @ rng.normal(size=(10, 10))
    for whiten in (True, False):
        inn = INNMap(**FAST_INN, whiten=whiten).fit(x[:200], y[:200])
        assert relative_error(inn.inverse(inn.transform(x)), x) < 1e-10
    with pytest.raises(LayersimError, match="whiten must be true or false"):
        INNMap(whiten="yes")


def test_a_loss_that_blows_up_without_nan_fails_loudly():
    """The detector on constructed histories (steady stretches, so that its 5 % moving means are exact): a real
    run's late losses at a too-high learning rate are chaotic (at lr 1 one CPU ended near 1e7, another near 1e3,
    another passed)."""
    def history(*stretches):
        return np.concatenate([np.full(100, value) for value in stretches])

    with pytest.raises(LayersimError) as raised:
        check_loss_history(history(8.0, 0.5, 1000.0), learning_rate=1.0)  # fell, then rose 2,000-fold, finite
    assert str(raised.value) == ("training blew up: the loss ended at 1000 after falling to 0.5 (it started at 8), so "
                                 "the map is worse than the network had been; lower align.learning_rate (now 1).")
    # Below its start but 50 times above its lowest (at width 768 a run once jumped from 0.0009 to 0.5).
    with pytest.raises(LayersimError, match=r"^training blew up \(network 2 of 3\): the loss ended at 0\.5 after "
                                            r"falling to 0\.01 \(it started at 8\).* \(now 0\.1\)\.$"):
        check_loss_history(history(8.0, 0.01, 0.5), 0.1, " (network 2 of 3)")
    with pytest.raises(LayersimError, match=r"^training blew up: the loss ended at 3 after falling to 1 "):
        check_loss_history(history(1.0, 1.0, 3.0), 0.1)  # never fell, ended 3 times its start
    with pytest.raises(LayersimError, match=r"^training diverged: the loss became inf at step 251 of 300; "):
        check_loss_history(np.concatenate([history(8.0, 0.5), np.full(50, 1.0), [np.inf], np.full(49, 1.0)]), 1.0)


def test_a_sound_or_negligible_loss_passes_the_blow_up_detector():
    check_loss_history(np.geomspace(8.7, 0.5, 300), 0.1)  # a fit that only falls
    check_loss_history(np.concatenate([np.full(100, 8.0), np.full(100, 0.5), np.full(100, 4.9)]), 0.1)  # < 10x lowest
    check_loss_history(np.concatenate([np.full(200, 1e-15), np.full(100, 1e-7)]), 0.1)  # float32 drift of an exact map


def test_a_training_that_blows_up_fails_loudly(rng):
    """End to end: a learning rate that is absurd in any rounding (100: Adam moves every weight by ~100 a step, so
    the loss ends some 20 orders of magnitude above its start) fails, finite or not; a sound fit passes."""
    x = _correlated(rng, 400, 8)
    y = np.tanh(x) @ rng.normal(size=(8, 8))
    with pytest.raises(LayersimError, match=r"training (blew up|diverged): the loss .* lower align.learning_rate"):
        INNMap(depth=2, hidden=32, steps=20, batch_size=64, learning_rate=100.0, schedule="constant").fit(x, y)
    INNMap(depth=2, hidden=32, steps=300, batch_size=64, learning_rate=0.1).fit(x, y)  # a fast but sound fit passes


def test_inn_inverse_reconstructs_inputs(rng):
    x = _correlated(rng, 300, 10)
    y = np.sin(x) + x @ rng.normal(size=(10, 10))
    inn = INNMap(**FAST_INN).fit(x[:200], y[:200])
    for rows in (x[200:], x[200:].astype(np.float32)):
        y_hat = inn.transform(rows)
        assert y_hat.dtype == rows.dtype
        assert relative_error(inn.inverse(y_hat), rows) < 1e-4
    assert relative_error(inn.inverse(inn.transform(x)), x) < 1e-10  # float64 all the way


def test_untrained_random_inn_inverts():
    flow = random_flow(12, depth=4, hidden=16, scale=2.0, seed=3)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(50, 12)))
    with torch.no_grad():
        y = flow(x)
        back = flow.inverse(y)
    assert torch.linalg.norm(y - x) > 0.5 * torch.linalg.norm(x)  # far from the identity
    assert torch.linalg.norm(back - x) < 1e-10 * torch.linalg.norm(x)


@pytest.mark.parametrize("dim", [2, 3, 5, 7, 8])
@pytest.mark.parametrize("depth", [2, 3, 4])
def test_every_coordinate_conditions_and_is_transformed_by_the_couplings(dim, depth):
    """The couplings alone (linear layer left out), initialised and then randomly perturbed: every
    input moves some other output (it conditions a block) and every output moves with some other
    input (it is transformed by a block); from three blocks on every output depends on every input.
    With a coordinate that conditions no block (odd widths, before the fix) no other output depends
    on that input: the Jacobian's column for it is zero off the diagonal."""
    torch.manual_seed(dim * 10 + depth)
    flow = CouplingFlow(dim, depth=depth, hidden=16, clamp=2.0, linear=False).double()
    with torch.no_grad():
        for parameter in flow.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    point = torch.randn(dim, dtype=torch.float64)
    jacobian = torch.autograd.functional.jacobian(lambda v: flow(v[None])[0], point)
    assert jacobian.shape == (dim, dim)
    nonzero = jacobian.abs() > 1e-9  # [i, j]: ∂ output_i / ∂ input_j != 0
    off_diagonal = nonzero & ~torch.eye(dim, dtype=torch.bool)
    assert off_diagonal.any(dim=0).all(), jacobian  # every input conditions something
    assert off_diagonal.any(dim=1).all(), jacobian  # every output is transformed by something
    if depth >= 3:  # two blocks are block-triangular (an affine coupling acts elementwise on u₂)
        assert nonzero.all(), jacobian
    kept, transformed = set(), set()
    for block in flow.blocks:
        order = block.permutation.tolist()
        kept |= set(order[: block.split])
        transformed |= set(order[block.split :])
    assert kept == transformed == set(range(dim))  # the layout itself
    with torch.no_grad():  # still exactly invertible
        x = torch.randn(20, dim, dtype=torch.float64)
        assert torch.allclose(flow.inverse(flow(x)), x, atol=1e-10)


def test_inn_map_fits_and_inverts_an_odd_width(rng):
    x = _correlated(rng, 200, 5)
    y = np.tanh(x) @ rng.normal(size=(5, 5))
    inn = INNMap(**FAST_INN).fit(x, y)
    assert [block.split for block in inn.module_.blocks] == [2, 3]
    assert relative_error(inn.inverse(inn.transform(x)), x) < 1e-10


def test_inn_starts_from_least_squares_and_trains_coupling_blocks(rng):
    x = _correlated(rng, 200, 6)
    y = x @ rng.normal(size=(6, 6))
    frozen_linear = INNMap(**{**FAST_INN, "steps": 1, "learning_rate": 1e-12, "linear_init": "least_squares"}).fit(x, y)
    assert relative_error(frozen_linear.transform(x), y) < 0.05  # ridge 1e-2 start ≈ least squares
    trained = INNMap(**FAST_INN, linear_init="least_squares").fit(x, y)
    assert trained.loss_history_[-20:].mean() < trained.loss_history_[:20].mean()


@pytest.mark.parametrize("name, options", [("inn", FAST_INN), ("mlp", FAST_MLP)])
def test_neural_maps_are_deterministic_under_a_seed(rng, name, options):
    x = _correlated(rng, 150, 6)
    y = np.tanh(x)
    first = make_map(name, seed=1, **options).fit(x, y).transform(x)
    state = torch.get_rng_state()
    again = make_map(name, seed=1, **options).fit(x, y).transform(x)
    other = make_map(name, seed=2, **options).fit(x, y).transform(x)
    assert torch.equal(state, torch.get_rng_state())  # fit leaves the global RNG alone
    np.testing.assert_array_equal(first, again)
    assert np.abs(first - other).max() > 1e-6


def test_mlp_maps_between_different_widths_and_has_no_inverse(rng):
    x = _correlated(rng, 120, 5)
    mlp = MLPMap(**FAST_MLP).fit(x, np.tanh(x[:, :3]))
    assert mlp.transform(x).shape == (120, 3)
    with pytest.raises(LayersimError, match="not invertible.*inn"):
        mlp.inverse(np.zeros((2, 3)))


# --- held-out rows and standardisation ---


def test_standardisation_uses_training_rows_only(rng):
    x = _correlated(rng, 100, 4)
    y = x @ rng.normal(size=(4, 3))
    train = np.arange(60)
    for name in MAPS:
        fitted = make_map(name, **{"inn": {**FAST_INN, "steps": 5}, "mlp": {**FAST_MLP, "steps": 5}}.get(name, {}))
        fitted.fit(x[train], (y if name != "inn" else y @ np.ones((3, 4)) + x)[train])
        np.testing.assert_allclose(fitted.x_scaler_.mean_, x[train].mean(0))
        np.testing.assert_allclose(fitted.x_scaler_.scale_, x[train].std(0))
    scaler = LinearRegressionMap().fit(x[train], y[train]).y_scaler_
    np.testing.assert_allclose(scaler.inverse_transform(scaler.transform(y)), y)


def test_held_out_and_unused_rows_never_reach_fit(rng):
    n = 160
    x = _correlated(rng, n, 6)
    y = np.tanh(x @ rng.normal(size=(6, 6)) / 4)
    train_idx, test_idx = np.arange(0, 100), np.arange(100, 140)  # rows 140.. are in neither
    methods = list(MAPS)
    options = {"inn": FAST_INN, "mlp": FAST_MLP}
    clean = alignment_errors([x], [y], methods, train_idx, test_idx, **options)

    poisoned_x, poisoned_y = x.copy(), y.copy()
    poisoned_x[140:], poisoned_y[140:] = np.nan, np.inf
    assert alignment_errors([poisoned_x], [poisoned_y], methods, train_idx, test_idx, **options) == clean

    # Huge test rows change the test errors but not the fitted maps (so not the training errors).
    poisoned_x[test_idx] *= 1e6
    poisoned_y[test_idx] += 1e6
    changed = alignment_errors([poisoned_x], [poisoned_y], methods, train_idx, test_idx, **options)
    for before, after in zip(clean, changed):
        assert after["train_mse"] == before["train_mse"]
        assert after["train_relative_error"] == before["train_relative_error"]
        assert after["mse"] != before["mse"]


def test_alignment_errors_rows_per_layer_and_method(rng):
    x_layers = [_correlated(rng, 90, 4) for _ in range(3)]
    y_layers = [a @ rng.normal(size=(4, 4)) + 0.1 * rng.normal(size=(90, 4)) for a in x_layers]
    train_idx, test_idx = train_test_split_rows(90, 0.25, seed=0)
    rows = alignment_errors(x_layers, y_layers, ["linear", "cca"], train_idx, test_idx)
    assert [(r["layer"], r["method"]) for r in rows] == [(l, m) for l in range(3) for m in ("linear", "cca")]
    for r in rows:
        y_test = y_layers[r["layer"]][test_idx]
        assert 0 < r["relative_error"] < 0.2
        spread = np.sum((y_test - y_test.mean(0)) ** 2)
        assert r["mse"] == pytest.approx(r["relative_error"] ** 2 * spread / y_test.size)


def test_layer_alignment_matrix(rng):
    base = _correlated(rng, 100, 4)
    layers = [base, np.tanh(base / 3), np.tanh(base / 3) ** 3]
    train_idx, test_idx = train_test_split_rows(100, 0.3, seed=1)
    m = layer_alignment_matrix(layers, None, "linear", train_idx=train_idx, test_idx=test_idx)
    assert m.shape == (3, 3)
    np.testing.assert_allclose(np.diag(m), 0.0, atol=1e-9)  # a layer maps onto itself exactly
    assert (m[~np.eye(3, dtype=bool)] > 1e-3).all()
    inn = layer_alignment_matrix(layers[:2], layers[1:], "inn", train_idx=train_idx, test_idx=test_idx,
                                 metric="mse", steps=20, depth=1, hidden=8)
    assert inn.shape == (2, 2) and np.isfinite(inn).all()


def test_map_representations_fits_on_train_and_maps_others(rng):
    x = _correlated(rng, 80, 5)
    y = x @ rng.normal(size=(5, 5)) + 1.0
    y_hat, fitted = map_representations(x[:60], y[:60], x[60:].astype(np.float32), "linear")
    assert y_hat.shape == (20, 5) and y_hat.dtype == np.float32
    assert isinstance(fitted, LinearRegressionMap)
    np.testing.assert_allclose(y_hat, y[60:], rtol=1e-4, atol=1e-4)


# --- metrics and splits ---


def test_metrics_hand_computed():
    y = np.array([[0.0, 1.0], [2.0, 3.0]])
    y_hat = np.array([[1.0, 1.0], [2.0, 1.0]])
    assert mse(y_hat, y) == pytest.approx((1 + 0 + 0 + 4) / 4)
    # ||ŷ − y||² = 5; y − mean(y) = ±[1, 1] per row, so ||·||² = 4.
    assert relative_error(y_hat, y) == pytest.approx(np.sqrt(5 / 4))
    with pytest.raises(LayersimError, match="constant"):
        relative_error(y, np.ones_like(y))
    with pytest.raises(LayersimError, match="shape"):
        mse(y, y[:1])


def test_train_test_split_rows():
    train, test = train_test_split_rows(50, 0.2, seed=3)
    assert len(test) == 10 and len(train) == 40
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(range(50))
    again = train_test_split_rows(50, 0.2, seed=3)
    np.testing.assert_array_equal(train, again[0])
    assert not np.array_equal(test, train_test_split_rows(50, 0.2, seed=4)[1])
    for bad in (0.0, 1.0, -0.1, "0.2"):
        with pytest.raises(LayersimError, match="test_fraction"):
            train_test_split_rows(50, bad)


# --- errors ---


def test_unknown_map_name_lists_valid_names():
    with pytest.raises(LayersimError) as err:
        make_map("procrustes")
    message = str(err.value)
    assert "'procrustes'" in message
    for name in ("linear", "cca", "svcca", "pwcca", "inn", "mlp"):
        assert name in message
    assert sorted(MAPS) == ["cca", "inn", "linear", "mlp", "pwcca", "svcca"]


def test_unknown_option_lists_valid_options():
    with pytest.raises(LayersimError, match=re.escape("unknown option 'stepz' for the 'inn' map")) as err:
        make_map("inn", stepz=10)
    assert "steps" in str(err.value) and "learning_rate" in str(err.value)
    with pytest.raises(LayersimError, match="ridge"):
        make_map("cca", ridge=1.0)


@pytest.mark.parametrize("name, options, pattern", [
    ("linear", {"ridge": -1.0}, "ridge must be >= 0"),
    ("svcca", {"variance_threshold": 0.0}, r"variance_threshold must be in \(0, 1\]"),
    ("cca", {"num_components": 0}, "num_components must be a positive integer"),
    ("cca", {"scale_by_correlation": "yes"}, "scale_by_correlation must be True or False"),
    ("inn", {"schedule": "step"}, "unknown schedule 'step'; valid schedules are: constant, cosine, linear"),
    ("inn", {"linear_init": "random"}, "valid linear_inits are: identity, least_squares"),
    ("mlp", {"steps": 0}, "steps must be a positive integer"),
    ("mlp", {"learning_rate": float("nan")}, "learning_rate must be a finite number"),
])
def test_invalid_option_values(name, options, pattern):
    with pytest.raises(LayersimError, match=pattern):
        make_map(name, **options)


def test_bad_inputs_raise(rng):
    x, y = rng.normal(size=(20, 4)), rng.normal(size=(19, 4))
    for name in MAPS:
        with pytest.raises(LayersimError, match="20 rows but y has 19"):
            make_map(name).fit(x, y)
    with pytest.raises(LayersimError, match="equal widths, got 4 and 3"):
        INNMap().fit(x, rng.normal(size=(20, 3)))
    with pytest.raises(LayersimError, match="not fitted"):
        CCAMap().transform(x)
    fitted = LinearRegressionMap().fit(x, x)
    with pytest.raises(LayersimError, match="3 columns but the map was fitted with 4-wide x"):
        fitted.transform(x[:, :3])
    with pytest.raises(LayersimError, match="non-finite"):
        LinearRegressionMap().fit(np.where(x > 1, np.nan, x), x)
    with pytest.raises(LayersimError, match="not square"):
        LinearRegressionMap().fit(x, x[:, :2]).inverse(x[:, :2])


def test_experiment_argument_errors(rng):
    x = rng.normal(size=(30, 3))
    train, test = np.arange(20), np.arange(20, 30)
    with pytest.raises(LayersimError, match="unknown map 'ica'"):
        alignment_errors([x], [x], ["linear", "ica"], train, test)
    with pytest.raises(LayersimError, match="options were given for 'inn'"):
        alignment_errors([x], [x], ["linear"], train, test, inn={"steps": 5})
    with pytest.raises(LayersimError, match="unknown option 'stepz'"):
        alignment_errors([x], [x], ["inn"], train, test, inn={"stepz": 5})
    with pytest.raises(LayersimError, match="share 1 rows"):
        alignment_errors([x], [x], ["linear"], train, np.array([19, 25]))
    with pytest.raises(LayersimError, match="outside 0..29"):
        alignment_errors([x], [x], ["linear"], train, np.array([30]))
    with pytest.raises(LayersimError, match="1 layers but y_layers has 2"):
        alignment_errors([x], [x, x], ["linear"], train, test)
    with pytest.raises(LayersimError, match="30 and 29 rows"):
        alignment_errors([x], [x[:29]], ["linear"], train, test)
    with pytest.raises(LayersimError, match="single array"):
        layer_alignment_matrix(x, None, "linear", train_idx=train, test_idx=test)
    with pytest.raises(LayersimError, match="valid metrics are: mse, relative_error"):
        layer_alignment_matrix([x], None, "linear", train_idx=train, test_idx=test, metric="r2")


@pytest.mark.parametrize("name", ["inn", "mlp"])
def test_maps_fitted_together_equal_maps_fitted_one_at_a_time(rng, name):
    """fit_maps trains the neural maps of several layers as one batched network; each comes out as its
    own fit would (the same losses, the same map), and the other kinds are fitted one by one."""
    xs = [_correlated(rng, 120, 6) for _ in range(4)]
    ys = [np.tanh(x) @ rng.normal(size=(6, 6)) for x in xs]
    options = {"steps": 25, "hidden": 16, "batch_size": 32, "device": "cpu"}
    together = fit_maps([make_map(name, **options) for _ in xs] + [make_map("linear")], list(zip(xs, ys)) + [(xs[0], ys[0])])
    for fitted, x, y in zip(together, xs, ys):
        alone = make_map(name, **options).fit(x, y)
        np.testing.assert_array_equal(fitted.loss_history_, alone.loss_history_)
        np.testing.assert_array_equal(fitted.transform(x), alone.transform(x))
    np.testing.assert_array_equal(together[-1].transform(xs[0]), make_map("linear").fit(xs[0], ys[0]).transform(xs[0]))
    with pytest.raises(LayersimError, match="2 maps but 1"):
        fit_maps([make_map(name, **options), make_map(name, **options)], [(xs[0], ys[0])])


def test_linear_maps_fitted_together_share_decompositions_and_equal_their_own_fits(rng, monkeypatch):
    """The linear maps of one group decompose each distinct array of rows once (two thin SVDs for the four
    methods of one layer pair, not eleven), and each comes out exactly as its own fit. Arrays that share their
    shape and first row but differ below it are different rows, not one."""
    import layersim.align.linear as linear

    # Small integers in 64 rows: every mean and variance is exact, so the rows of x permuted below its first
    # standardise to exactly x's standardised rows, permuted: its shape and first row, other rows.
    x, y = rng.integers(-8, 9, size=(64, 5)).astype(float), _correlated(rng, 64, 4)
    x_twin = np.concatenate([x[:1], rng.permutation(x[1:])])
    calls = []
    monkeypatch.setattr(linear, "thin_svd", lambda a, *args: calls.append(a.shape) or thin_svd(a, *args))
    pairs = [(x, y)] * len(LINEAR_NAMES) + [(x_twin, y)] * len(LINEAR_NAMES)
    together = fit_maps([make_map(name) for name in LINEAR_NAMES * 2], pairs)
    assert len(calls) == 3  # x, y and x_twin: each standardised array once
    for fitted, name, (xi, yi) in zip(together, LINEAR_NAMES * 2, pairs):
        alone = make_map(name).fit(xi, yi)
        np.testing.assert_array_equal(fitted.matrix_, alone.matrix_)
        np.testing.assert_array_equal(fitted.transform(xi), alone.transform(xi))
    assert not np.allclose(together[0].matrix_, together[len(LINEAR_NAMES)].matrix_)
