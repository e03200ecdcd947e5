"""The C library's functions Python does not wrap (``prctl``, ``mount``, ``fallocate``...): this
process's own symbols (``CDLL(None)``), not ``ctypes.util.find_library("c")``, which runs
``ldconfig -p`` in a subprocess each time (5-8 ms, far more on a loaded machine, on the way
of every mount and worker start)."""

from __future__ import annotations

import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)
M_MMAP_THRESHOLD = -3  # mallopt(3)'s parameter
LARGE = 128 << 10  # glibc's default threshold, before it moves


def map_large_buffers() -> None:
    """Have the C library map each buffer of ``LARGE`` bytes or more apart, and unmap it when it is
    freed. glibc's threshold otherwise rises to the largest such buffer freed (up to 32 MiB),
    and larger buffers are then carved from its heap, whose gaps stay this process's: a daemon
    that cycles fetched ranges and shards of a few MiB keeps 4-6 MiB more (doc/BENCHMARKING.md,
    "The memory of a supervised mount"). Nothing where the C library has no ``mallopt``."""
    mallopt = getattr(LIBC, "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, LARGE)
