"""Heap memory a process has freed, given back to the system."""

from __future__ import annotations

import ctypes


def give_back_freed_memory() -> None:
    """Return the heap memory the C allocator holds free to the system (glibc's `malloc_trim`).

    glibc keeps freed blocks for reuse, up to its trim threshold (which large frees raise to 64
    MB), so the one-off arrays of a start as long as the data set (the p~ over every sequence,
    the unique rewards) would stay in each rank's private memory (`RssAnon`). Nothing happens
    where the C library has no `malloc_trim` (musl, macOS)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
