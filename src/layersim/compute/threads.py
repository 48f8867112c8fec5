"""Independent units of work on a small pool of threads, each unit's BLAS, LAPACK and torch work on the thread that
runs it.

A stage's numerical loops (a null's rows of cells, a weight matrix's SVDs and null draws) are made of units that
share nothing, each too small for two BLAS threads to split well: BLAS and OpenMP threads that wait on each other lose
many times their time when another process takes a core (20 draws of the weights null on 384 × 384 took 14.5 CPU
seconds on two BLAS threads beside other work, 0.84 on one; two 2-thread torch processes on 2 cores ran 10× slower
than one after the other). So the units run side by side, one per core, each single-threaded. A unit's numbers do not
depend on how many threads ran: each is computed by one thread whatever the pool's size (single-threaded MKL and
OpenBLAS give the same bits as their threaded runs on these shapes; tests/test_threads.py checks torch's)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from layersim.compute.linalg import blas_on_calling_thread


@contextlib.contextmanager
def torch_on_calling_thread() -> Iterator[int]:
    """A context in which torch's operators run on the calling thread (one intra-op thread), yielding how many
    threads torch had: a thread started inside takes torch's count when it first runs an operator, so the pool's
    workers run single-threaded too. The count is restored on leaving."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def on_threads(function: Callable, keys: Iterable, workers: int | None = None) -> dict:
    """{key: function(key)}, in `keys`' order, computed on `workers` threads (default: torch's thread count, the
    stage's cores), each running NumPy's BLAS and LAPACK and torch's operators on itself (module docstring). With one
    worker the calls run in order on the calling thread, under the same single-threaded libraries; a lone key keeps the
    libraries' own threads (nothing runs beside it)."""
    keys = list(keys)
    if len(keys) == 1:
        return {keys[0]: function(keys[0])}
    with blas_on_calling_thread(), torch_on_calling_thread() as threads:
        count = max(1, min(len(keys), threads if workers is None else workers))
        if count == 1:
            return {key: function(key) for key in keys}
        with ThreadPoolExecutor(count) as pool:
            return dict(zip(keys, pool.map(function, keys)))
