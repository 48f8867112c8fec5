"""layersim.compute.threads: independent pieces on a few threads give what one thread gives, in order, with the
libraries' own thread pools held at one thread while they run and restored after."""

import threading
import time

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from layersim.compute.device import analysis_device, analysis_on
from layersim.compute.threads import on_threads, thread_pool
from layersim.similarity.inference.null import permutation_matrix


def _blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def _piece(seed: int) -> tuple:
    """Work of the kinds the analysis stages run: a null (torch products on the analysis device) and a NumPy SVD."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(40, 6)), rng.normal(size=(40, 5))
    null = permutation_matrix("svcca", [x, y], permutations=9, seed=seed)
    return null.observed.tobytes(), null.p_value.tobytes(), np.linalg.svd(x, compute_uv=False).tobytes()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_equal_one_threads_bit_for_bit_in_the_keys_order(workers):
    alone = {seed: _piece(seed) for seed in range(6)}
    found = on_threads(_piece, range(6), workers=workers)
    assert list(found) == list(range(6))
    assert found == alone


def test_the_pieces_run_on_several_threads_when_given_several():
    seen, barrier = set(), threading.Barrier(2, timeout=10)

    def piece(key):
        barrier.wait()  # both pieces at once, or this times out
        seen.add(threading.get_ident())
        return key

    assert on_threads(piece, [0, 1], workers=2) == {0: 0, 1: 1}
    assert len(seen) == 2


def test_blas_and_torch_run_on_the_calling_thread_inside_and_are_restored_after():
    torch_before, blas_before = torch.get_num_threads(), _blas_threads()
    with thread_pool(2) as pool:
        inside = pool.submit(lambda: (torch.get_num_threads(), _blas_threads())).result()
    assert inside == (1, {1})
    assert torch.get_num_threads() == torch_before
    assert _blas_threads() == blas_before


def test_each_piece_sees_the_callers_context():
    with analysis_on(torch.device("meta")), thread_pool(2) as pool:
        assert pool.submit(analysis_device).result() == torch.device("meta")
    assert analysis_device() == torch.device("cpu")


def test_an_error_drops_the_pieces_not_started_and_is_raised():
    ran, later = [], []

    def hold():  # the only worker stays busy until the pieces queued behind it are dropped
        deadline = time.monotonic() + 30
        while not (later and all(future.cancelled() for future in later)) and time.monotonic() < deadline:
            time.sleep(0.01)

    with pytest.raises(ValueError, match="stop"):
        with thread_pool(1) as pool:
            pool.submit(hold)
            later += [pool.submit(ran.append, k) for k in range(5)]
            raise ValueError("stop")
    assert all(future.cancelled() for future in later)
    assert ran == []


def test_a_lone_piece_keeps_the_libraries_own_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert on_threads(lambda key: torch.get_num_threads(), ["only"]) == {"only": 2}
        assert on_threads(lambda key: key, []) == {}
    finally:
        torch.set_num_threads(before)


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
