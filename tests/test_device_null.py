"""The null engines' torch path (layersim.similarity.inference._null_engines) against the measures' own numpy functions:
every permuted value of every engine equals ``similarity_matrix(name, xs, [y[π] for y in ys])`` (the oracle: each
measure's pair code, which shares nothing with the engines' batched products and reductions), for batches of
permutations as for one; and a null does not depend on how many permutations a batch holds (the same draws, the same
p-values). The GPU runs the same code on another device: benchmarks/gpu_check.py checks it there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import layersim.compute.device as device_module
from layersim.errors import LayersimError
from layersim.compute.device import analysis_batch, analysis_device, analysis_on
from layersim.similarity import MEASURES, permutation_matrix, similarity_matrix
from layersim.similarity.inference._null_engines import ENGINES

ENGINE_MEASURES = sorted(ENGINES)


def _layers(rng, n=36):
    base = rng.normal(size=(n, 5))
    xs = [base @ rng.normal(size=(5, 6)) + 0.3 * rng.normal(size=(n, 6)), rng.normal(size=(n, 4)) ** 3]
    ys = [base @ rng.normal(size=(5, 7)) + 0.5 * rng.normal(size=(n, 7)), rng.normal(size=(n, 5)),
          np.tanh(base @ rng.normal(size=(5, 3)))]
    return xs, ys


def _named(layers, side):
    return [(f"{side}[{k}]", a) for k, a in enumerate(layers)]


@pytest.mark.parametrize("name", ENGINE_MEASURES)
def test_every_permuted_value_equals_the_measure_on_the_permuted_rows(name):
    rng = np.random.default_rng(1)
    xs, ys = _layers(rng)
    cells = np.ones((len(xs), len(ys)), dtype=bool)
    engine = ENGINES[name](_named(xs, "xs"), _named(ys, "ys"), cells)
    perms = np.stack([rng.permutation(len(xs[0])) for _ in range(4)])
    batch = engine.values_batch(perms)
    assert batch.shape == (4, len(xs), len(ys))
    for perm, values in zip(perms, batch):
        expected = similarity_matrix(name, xs, [y[perm] for y in ys])
        np.testing.assert_allclose(values, expected, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(engine.values(perm), values, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(engine.values(None), similarity_matrix(name, xs, ys), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("method", ["gram", "feature"])
@pytest.mark.parametrize("name", ["linear_cka", "debiased_cka"])
def test_both_cka_routes_equal_the_measure(name, method):
    """Sample space (permuted n x n kernels, the batched gather) and feature space (the stacked products)."""
    rng = np.random.default_rng(2)
    xs, ys = _layers(rng, n=20)
    cells = np.array([[True, False, True], [True, True, False]])
    engine = ENGINES[name](_named(xs, "xs"), _named(ys, "ys"), cells, method=method)
    perms = np.stack([rng.permutation(20) for _ in range(3)])
    for perm, values in zip(perms, engine.values_batch(perms)):
        expected = similarity_matrix(name, xs, [y[perm] for y in ys])
        np.testing.assert_allclose(values[cells], expected[cells], rtol=1e-9, atol=1e-11)
        assert np.isnan(values[~cells]).all()


@pytest.mark.parametrize("cells", [[[True, True, True], [False, False, True]], [[True, False, False], [True, True, False]],
                                   [[False, True, False], [False, True, False]]])
@pytest.mark.parametrize("name", ["linear_cka", "debiased_cka", "rbf_cka", "rsa", "distance_correlation", "rsm_norm"])
def test_the_kernel_engine_gathers_either_side_to_the_same_values(name, cells):
    """The kernel engines gather the side with fewer kernels in the cells (by π⁻¹ on the x side): more columns than
    rows, more rows than columns, a single row, all equal to the measure on the permuted rows."""
    rng = np.random.default_rng(7)
    xs, ys = _layers(rng, n=18)
    cells = np.array(cells)
    options = {"method": "gram"} if name in ("linear_cka", "debiased_cka") else {}
    engine = ENGINES[name](_named(xs, "xs"), _named(ys, "ys"), cells, **options)
    perms = np.stack([rng.permutation(18) for _ in range(3)])
    for perm, values in zip(perms, engine.values_batch(perms)):
        expected = similarity_matrix(name, xs, [y[perm] for y in ys])
        np.testing.assert_allclose(values[cells], expected[cells], rtol=1e-9, atol=1e-11)
        assert np.isnan(values[~cells]).all()


@pytest.mark.parametrize("name", ["svcca", "neuronsim", "rsa", "linear_cka", "gulp", "hard_correlation_match"])
def test_a_null_does_not_depend_on_the_batch_size(monkeypatch, name):
    rng = np.random.default_rng(3)
    xs, _ = _layers(rng, n=30)
    groups = np.repeat(np.arange(10), 3)  # block permutations too: whole examples of three rows
    options = {"exact": False} if name == "linear_cka" else {}
    batched = permutation_matrix(name, xs, permutations=23, seed=5, groups=groups, **options)
    monkeypatch.setattr(device_module, "CPU_BATCH_BYTES", 1)  # one permutation at a time
    single = permutation_matrix(name, xs, permutations=23, seed=5, groups=groups, **options)
    for field in ("observed", "null_mean", "null_p95", "p_value"):
        np.testing.assert_allclose(getattr(batched, field), getattr(single, field), rtol=1e-12, atol=1e-13)
    assert batched.method == "block permutation"


def test_the_analysis_device_is_the_cpu_unless_a_context_sets_it():
    assert analysis_device() == torch.device("cpu")
    with analysis_on(torch.device("cpu")):
        assert analysis_device() == torch.device("cpu")
    assert analysis_batch(1e6, 100, torch.device("cpu")) == min(100, device_module.CPU_BATCH_BYTES // 10**6)
    assert analysis_batch(1e30, 100, torch.device("cpu")) == 1  # never zero, however large a permutation
    assert analysis_batch(1.0, 7, torch.device("cpu")) == 7      # never more than asked


def test_every_measure_with_a_null_has_an_engine_or_its_own():
    """The registry's measures all reach an engine: the null and the bootstrap look them up by name; those with none
    (the differences of summaries) say why, and a null of one is refused in that sentence."""
    assert {name for name, m in MEASURES.items() if not m.no_null} == set(ENGINES)
    for name in {name for name, m in MEASURES.items() if m.no_null}:
        with pytest.raises(LayersimError, match="no null: a difference of summaries"):
            permutation_matrix(name, [np.random.default_rng(0).normal(size=(12, 3))], permutations=5)
