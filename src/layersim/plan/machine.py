"""What this machine does, measured when a plan runs (:mod:`layersim.plan.timing` turns a stage's counts into
seconds with these): torch's float32 matmul on one thread and sustained on all of them, and a probe of Python-level
work against its time on the reference CPU that the plan's constants were measured on."""

from __future__ import annotations

import contextlib
import marshal
import time
from collections.abc import Callable, Iterator

# The Python-level probe (:func:`python_probe_seconds`) on the reference CPU above: the best of its repeats, measured
# there (2026-11-29: 3.03-3.27 ms over 8 calls, with 15 processes competing for the 2 cores).
REFERENCE_PROBE_SECONDS = 0.0030
# What the probe runs: a small module's code object unmarshalled and executed (what an import does with a .pyc) and
# small numpy calls (a similarity cell's bookkeeping, a layer pass's dispatch).
PROBE_SOURCE = """
import math
class Shape:
    def __init__(self, layers, hidden):
        self.layers, self.hidden = layers, hidden
    def flops(self, tokens):
        return {f"layer{i}": 2 * self.hidden ** 2 * tokens for i in range(self.layers)}
def table(rows):
    return {str(k): [math.sqrt(k + j) for j in range(8)] for k in range(rows)}
VALUES = table(40)
SHAPES = [Shape(i % 12 + 1, 64 * (i % 8 + 1)).flops(i) for i in range(40)]
"""


@contextlib.contextmanager
def _products_on(threads: int | None, size: int) -> Iterator[tuple]:
    """Two random size × size float32 operands, one product already taken, with torch on `threads` (None: its own
    count) until the block ends; yields the operands and the thread count in force."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        yield a, b, torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def measured_cpu_flops(threads: int | None = None, size: int = 2048, repeats: int = 3,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """This machine's float32 matmul throughput on torch's threads (or `threads`): the best of a few 2048×2048
    products (17 GFLOP each, a few hundred ms in all), timed by `clock` (time.thread_time on one thread: per CPU
    second, what the thread does alone when other jobs stretch its wall clock)."""
    with _products_on(threads, size) as (a, b, _):
        best = float("inf")
        for _ in range(repeats):
            start = clock()
            a @ b
            best = min(best, clock() - start)
    return 2 * size ** 3 / best


def sustained_cpu_flops(one_thread: float, threads: int | None = None, seconds: float = 1.5) -> float:
    """What the stages sustain on all of torch's threads (or `threads`): 2048² products back to back for `seconds`
    (at least three), their mean rate, at most threads × the one-thread rate `one_thread`. On a 2-core VM (AMD EPYC,
    2026-11-29, quiet) single products on two threads swung between 97 and 179 GFLOP/s from one second to the next
    while one thread's held within ±5 % (79-88), and the quickstart's training sustained about 134 over minutes
    (finetune 55-63 s a seed, planned at 134): a best-of-3 read anywhere from 94 to 179, the plan up to 40 % off; a
    window's mean swings less (107-161 over 1 s). Another VM of the kind sustained 2 × its one-thread rate (223 / 112,
    2026-11-27): how far a second thread adds is the machine's, so it is measured, not assumed."""
    with _products_on(threads, 2048) as (a, b, count):
        products, start = 0, time.perf_counter()
        while products < 3 or time.perf_counter() - start < seconds:
            a @ b
            products += 1
        rate = products * 2 * 2048 ** 3 / (time.perf_counter() - start)
    return min(rate, count * one_thread)


def python_probe_seconds(repeats: int = 150, clock: Callable[[], float] = time.thread_time) -> float:
    """This machine's time for a fixed piece of Python-level work (:data:`PROBE_SOURCE` executed 10 times, 100 rounds
    of small numpy calls): the best of `repeats` (about 3 ms each on the reference CPU: 0.45 s, long enough to find a
    fast window on a VM whose neighbours slow it for a second at a time: the best of 50 read 4.1-4.5 ms for five calls
    in a row and 2.7 after, 2026-11-29), timed by `clock`: the thread's CPU time by default, which other processes on the cores barely change (the wall clock's best of 50 read
    3-4 × the quiet figure at a load of 9 on 2 cores, the CPU time's within 1.3 ×), as a slower CPU does change it.
    A CPU quota (benchmarks/plan_accuracy.py --cpu-quota) stretches only the wall clock: the probe, like the
    CPU seconds, reads the CPU's own speed."""
    import numpy as np

    code = marshal.dumps(compile(PROBE_SOURCE, "<probe>", "exec"))
    a = np.arange(64.0).reshape(8, 8)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for _ in range(10):
            exec(marshal.loads(code), {})
        for _ in range(100):
            (a @ a).sum()
            a.mean(axis=0)
            np.sqrt(a)
        best = min(best, clock() - start)
    return best
