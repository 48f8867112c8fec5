"""Independent pieces of NumPy and torch work on a few threads, one core each.

NumPy's ufuncs, its BLAS and LAPACK, and torch's kernels release the GIL, so Python threads that each run a
separate piece (a measure, a pooling, a batch of weight matrices) fill the cores that one thread leaves idle
(the similarity stage alone used 118 % of two cores). Each thread then runs BLAS (NumPy's and SciPy's) and torch's
intra-op work on itself: pools of BLAS or OpenMP threads that wait on each other lose many times their time once
more threads than cores want to run (measured for issue 64: two 2-thread torch processes on 2 cores ran 10× slower
than one after the other; 20 draws of a 384 × 384 null took 14.5 CPU seconds on two BLAS threads beside other work,
0.84 on one). So a pool's threads replace the libraries' own, never add to them.

Every piece runs in a copy of the caller's context (:mod:`contextvars`: e.g. the analysis device that
layersim.compute.device.analysis_on sets), and results come back in the order given, so what is computed does not
depend on how many threads ran it, as long as the pieces share no state they change (single-threaded MKL and
OpenBLAS give the same bits as their threaded runs on these shapes; tests/test_threads.py checks torch's and the
product engine's nulls). A lone piece keeps the libraries' own threads: one row of a null's cells, say, still has its
product on every core.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from layersim.compute.linalg import blas_on_calling_thread


def default_workers() -> int:
    """torch's intra-op thread count (by default the cores this process may use): the pool's threads take them."""
    import torch

    return max(1, torch.get_num_threads())


class _ContextPool(Executor):
    """A thread pool whose pieces each run in a copy of the submitting thread's context."""

    def __init__(self, workers: int):
        self._pool = ThreadPoolExecutor(workers)

    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        return self._pool.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


@contextlib.contextmanager
def thread_pool(workers: int | None = None) -> Iterator[Executor]:
    """An executor of `workers` threads (default :func:`default_workers`) inside which BLAS and torch's intra-op
    work run on the calling thread (module docstring); on leaving, every piece submitted has finished (on an error, the
    pieces not yet started are dropped) and torch's thread count is restored. One worker runs the pieces one after the other, in the order submitted."""
    import torch

    workers = default_workers() if workers is None else max(1, int(workers))
    before = torch.get_num_threads()
    with blas_on_calling_thread():
        torch.set_num_threads(1)
        pool = _ContextPool(workers)
        try:
            yield pool
        except BaseException:  # the pieces not started yet are dropped: the error is reported when the running end
            pool.shutdown(cancel_futures=True)
            raise
        finally:
            pool.shutdown()
            torch.set_num_threads(before)


def on_threads(function: Callable, keys: Iterable, workers: int | None = None) -> dict:
    """{key: function(key)} for every key, in the keys' order, computed on a :func:`thread_pool` of `workers` threads
    (default :func:`default_workers`); a lone key is computed on the calling thread with the libraries' own threads."""
    keys = list(keys)
    if len(keys) <= 1:
        return {key: function(key) for key in keys}
    with thread_pool(min(len(keys), workers or default_workers())) as pool:
        return dict(zip(keys, pool.map(function, keys)))
