"""How glibc's allocator hands large blocks back to the system: two policies, one for speed, one for measuring;
and how much memory the system has left to give (:func:`available_bytes`).

glibc serves an allocation above its mmap threshold (dynamic, at most 32 MiB on 64-bit) with a fresh mapping and
unmaps it when it is freed. A CPU training step frees and allocates the same large tensors every step (at the
default model, the head's logits and gradient, 50 MB each), so the kernel maps, page-faults and zeroes them
anew each time: at the default model a quarter of the training process's CPU time went to the kernel.

- :func:`reused_freed_memory` (training): no mappings, and the heap never trimmed, so each step's large tensors
  come from what the previous step freed. Left at its end, the heap is trimmed and glibc's default limits restored
  (its mmap threshold then stays where it was, no longer adapted: any mallopt setting turns that off).
- :func:`return_freed_memory` (measuring memory): every block of 1 MiB or more its own mapping, so a resident
  peak is that of the live tensors, not of what earlier work left in the heap.

Both act through ``mallopt``; where there is none (not glibc) they do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator
from pathlib import Path

# <malloc.h>; setting any of them also turns glibc's dynamic mmap threshold off for the process.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def reused_freed_memory() -> Iterator[bool]:
    """Within the block, freed memory stays in the heap for the next allocation; yields whether that took effect."""
    libc = _libc()
    active = libc is not None and libc.mallopt(M_MMAP_MAX, 0) == 1
    if active:
        libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1))
    try:
        yield active
    finally:
        if active:
            libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
            libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
            libc.malloc_trim(0)


def return_freed_memory() -> bool:
    """Make glibc give every block of 1 MiB or more its own mapping, unmapped when freed, for the rest of the
    process; True where that took effect (glibc).

    By default glibc raises its mmap threshold after large frees and then serves large tensors from a heap it
    keeps, so the resident set's peak during a block depends on what earlier work left behind (the same scoring
    step grows by very different amounts in two processes). With a fixed threshold the peak is that of
    the live tensors. Slower (every large tensor is a fresh mapping): for measurements, not for real runs.
    """
    libc = _libc()
    return libc is not None and libc.mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1


def available_bytes() -> int | None:
    """The memory this process may still take before the system kills it: Linux's MemAvailable, or less where a
    cgroup (a container, a batch job) caps it; None where neither can be read."""
    limits = []
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        limits += [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    except (OSError, ValueError):
        pass
    try:
        cap, used = (Path("/sys/fs/cgroup", name).read_text().strip() for name in ("memory.max", "memory.current"))
        if cap != "max":
            limits.append(int(cap) - int(used))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None
