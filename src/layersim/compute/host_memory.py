"""Host memory kept for reuse while a training loop runs.

glibc's malloc hands every block over 32 MB (its largest mmap threshold) back to the kernel when it is freed, and a
block that large is allocated again at every step of a training loop: the dense gradient of the token-embedding
table (MiniLM's 30,522 × 384: 47 MB; RoBERTa-base's 154 MB), freed by ``zero_grad(set_to_none=True)``. Each
step then page-faults the whole block in afresh and the kernel zeroes it first: on the quickstart's fine-tuning
runs about 11 % of their CPU seconds, as system time. Within :func:`reused_host_memory` malloc serves large blocks
from its heap and keeps freed ones there, so the next step reuses the same pages. Only where the memory comes
from changes: every tensor keeps torch's 64-byte alignment, and the numbers computed are the same bit for bit.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Iterator

# mallopt(3) parameters and glibc's defaults.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536
NEVER_TRIM = -1  # read by glibc as the largest size_t: no heap top is ever trimmed


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has mallopt and malloc_trim); None elsewhere (macOS, musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own symbol: another C library's mallopt may differ
        libc.mallopt.argtypes, libc.malloc_trim.argtypes = (ctypes.c_int, ctypes.c_int), (ctypes.c_size_t,)
        return libc
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def reused_host_memory() -> Iterator[bool]:
    """Within the context, large blocks come from malloc's heap and freed memory stays there for the next
    allocation (no mmap, no trimming); on exit glibc's defaults come back and the kept memory is returned to the
    system. Yields whether the setting applied (False where the C library is not glibc: nothing changes)."""
    libc = _glibc()
    if libc is None:
        yield False
        return
    applied = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    try:
        yield applied
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)
