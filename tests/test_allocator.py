"""popmq.allocator: freed memory goes back to the system (glibc's malloc_trim), which glibc
does not do by itself while its heap is fragmented (the case after a spike of large
requests: issue 20, allocator)."""

from __future__ import annotations

import os
import platform

import psutil
import pytest

from popmq import allocator

MB = 1_000_000


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_a_fragmented_heap_to_the_system() -> None:
    """200 MB in 64 KiB pieces (below glibc's mmap threshold: they live in its heap), freed but
    for every 64th piece, which pins the heap so glibc cannot shrink it by itself: RSS stays
    up until trim() hands the free pages back."""
    process = psutil.Process(os.getpid())
    pieces = [bytearray(64 * 1024) for _ in range(3200)]
    for piece in pieces:
        piece[::4096] = b"x" * len(piece[::4096])  # touch every page
    kept = pieces[::64]
    del pieces
    before = process.memory_info().rss
    assert allocator.trim()
    after = process.memory_info().rss
    assert (before - after) / MB >= 100, f"{before / MB:.0f} -> {after / MB:.0f} MB"
    del kept
