"""reused_host_memory: a large block comes from malloc's heap and stays there when freed, for the next step's block to
reuse its pages (no fresh page faults); glibc's defaults come back after it; nothing computed changes."""

import ctypes

import pytest
import torch

from layersim.compute.host_memory import _glibc, reused_host_memory

BLOCK = 64 << 20  # over glibc's largest mmap threshold (32 MB), as a token-embedding table's gradient is

needs_glibc = pytest.mark.skipif(_glibc() is None, reason="mallopt is glibc's")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _block_where() -> tuple[int, int]:
    """(bytes malloc mapped for large blocks when a BLOCK-sized tensor was allocated, bytes its heap gained as free
    space when the tensor was freed), from glibc's mallinfo2."""
    libc = _glibc()
    libc.mallinfo2.restype = _MallInfo2
    before = libc.mallinfo2()
    block = torch.empty(BLOCK // 4).fill_(1.0)
    alive = libc.mallinfo2()
    del block
    freed = libc.mallinfo2()
    return alive.hblkhd - before.hblkhd, freed.fordblks - alive.fordblks


@needs_glibc
def test_a_large_block_comes_from_the_heap_and_stays_there_freed_within_the_context_only():
    with reused_host_memory() as applied:
        assert applied
        mapped, kept = _block_where()
    assert mapped == 0 and kept > 0.9 * BLOCK  # from the heap, and kept there for the next step's block
    mapped, kept = _block_where()
    assert mapped >= BLOCK and kept < 0.1 * BLOCK  # glibc's defaults again: mapped for itself, unmapped when freed


def test_training_inside_the_context_gives_the_same_weights_bit_for_bit():
    def trained(context) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(20000, 256), torch.nn.Linear(256, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        with context():
            for step in range(3):
                tokens = torch.randint(0, 20000, (8, 5), generator=torch.Generator().manual_seed(step))
                model(tokens).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return model.state_dict()

    import contextlib

    plain, reused = trained(contextlib.nullcontext), trained(reused_host_memory)
    assert all(torch.equal(plain[name], reused[name]) for name in plain)
