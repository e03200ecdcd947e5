"""The C library's functions Python does not wrap (``prctl``, ``mount``, ``fallocate``...): this
process's own symbols (``CDLL(None)``), not ``ctypes.util.find_library("c")``, which runs
``ldconfig -p`` in a subprocess each time (5-8 ms, far more on a loaded machine, on the way
of every mount and worker start)."""

from __future__ import annotations

import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)


def trim_heap() -> None:
    """Give the free memory of this process's heap back to the system: glibc's ``malloc_trim(0)``,
    over every arena (those of obstore's threads too), not only the top of the main one as glibc
    does by itself on each ``free``. Pages given back are faulted in again when reused."""
    LIBC.malloc_trim(0)
