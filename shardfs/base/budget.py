"""A budget of bytes that blocking calls in worker threads hold at once (``Budget``): what
bounds the memory of decoding transcoded chunks, however many reads run (doc/SECURITY.md#bounds).

Contract: ``hold(n)`` is a context manager that waits until ``n`` more bytes fit in ``total``
and holds them until it exits; an ``n`` larger than ``total`` waits until nothing is held and
then runs alone. Threads only: never call it on the trio thread.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator


class Budget:
    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self.held = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, n: int) -> Iterator[None]:
        n = min(max(0, n), self.total)
        with self._cond:
            self._cond.wait_for(lambda: self.held + n <= self.total)
            self.held += n
        try:
            yield
        finally:
            with self._cond:
                self.held -= n
                self._cond.notify_all()
