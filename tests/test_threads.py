"""Independent units on a pool of threads (layersim.compute.threads): every key's result, in the keys' order, each
unit single-threaded, the same numbers whatever the pool's size, and torch's thread count given back."""

import threading

import numpy as np
import pytest
import torch

from layersim.compute.threads import on_threads, torch_on_calling_thread
from layersim.similarity.inference.null import permutation_matrix


@pytest.fixture
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_every_key_gets_its_own_result_in_the_keys_order(two_torch_threads):
    keys = [5, 3, 9, 1, 7]
    found = on_threads(lambda k: k * k, keys)
    assert list(found) == keys
    assert found == {k: k * k for k in keys}
    assert on_threads(lambda k: k, []) == {}


def test_units_run_on_more_than_one_thread_each_single_threaded(two_torch_threads):
    barrier = threading.Barrier(2, timeout=30)  # both units must be running at once to pass it

    def unit(key):
        barrier.wait()
        return threading.get_ident(), torch.get_num_threads()

    found = on_threads(unit, ["a", "b"])
    assert len({ident for ident, _ in found.values()}) == 2
    assert all(threads == 1 for _, threads in found.values())
    assert torch.get_num_threads() == 2  # given back


def test_torch_count_is_given_back_when_a_unit_fails(two_torch_threads):
    def unit(key):
        raise ValueError(f"bad {key}")

    with pytest.raises(ValueError, match="bad"):
        on_threads(unit, [1, 2])
    assert torch.get_num_threads() == 2
    with torch_on_calling_thread() as threads:
        assert threads == 2 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_the_numbers_do_not_depend_on_the_pool_size(two_torch_threads):
    rng = np.random.default_rng(0)
    a, b = torch.as_tensor(rng.normal(size=(4, 96, 200))), torch.as_tensor(rng.normal(size=(200, 300)))

    def unit(k):
        return (torch.matmul(a[k], b).abs().amax(dim=-1), np.linalg.svd(a[k].numpy(), compute_uv=False))

    one, two = on_threads(unit, range(4), workers=1), on_threads(unit, range(4), workers=2)
    for k in range(4):
        assert torch.equal(one[k][0], two[k][0]) and np.array_equal(one[k][1], two[k][1])


@pytest.mark.parametrize("measure", ["neuronsim", "svcca", "linear_cka"])
def test_a_product_engine_null_is_the_same_on_one_torch_thread_and_on_two(measure):
    """The product engine's rows run on the pool (one per core): its null must not depend on how many ran."""
    rng = np.random.default_rng(1)
    base = rng.normal(size=(60, 12))
    layers = [base + rng.normal(size=(60, 12)) * s for s in (0.3, 0.6, 1.0, 2.0)]
    before = torch.get_num_threads()
    found = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            found.append(permutation_matrix(measure, layers, permutations=9, seed=3, exact=False, method="feature")
                         if measure == "linear_cka" else permutation_matrix(measure, layers, permutations=9, seed=3))
    finally:
        torch.set_num_threads(before)
    for field in ("observed", "null_mean", "null_p95", "p_value"):
        assert np.array_equal(getattr(found[0], field), getattr(found[1], field), equal_nan=True), field
