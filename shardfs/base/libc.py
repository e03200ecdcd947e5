"""The C library's functions Python does not wrap (``prctl``, ``mount``, ``fallocate``...): this
process's own symbols (``CDLL(None)``), not ``ctypes.util.find_library("c")``, which runs
``ldconfig -p`` in a subprocess each time (5-8 ms, far more on a loaded machine, on the way
of every mount and worker start)."""

from __future__ import annotations

import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)
