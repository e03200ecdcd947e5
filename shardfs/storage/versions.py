"""Versions of keys remembered for a short time, for both ``Storage`` implementations.

A version is looked at by every lookup, getattr and open; a stat (or, for objects, a HEAD)
per call would dominate them. ``Remembered`` keeps what a stat, a HEAD, a versioned read or a
listing saw for ``ttl`` seconds. A writer's ``forget`` also invalidates every answer being
fetched at that moment: ``token()`` taken before the request, ``put(..., token)`` after it
keeps the answer only if no key was forgotten meanwhile (it may predate the change).
"""

from __future__ import annotations

import threading
import time

from shardfs.storage import UNKNOWN, Unusable, Version, Unknown
from shardfs.storage.sharedversions import SharedVersions

MAX_KEYS = 65536  # remembered versions before all are dropped at once (cheap, and rare)


class Remembered:
    """``key -> Version | None | Unusable`` for ``ttl`` seconds (thread-safe)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[float, Version | Unusable | None]] = {}
        self._lock = threading.Lock()
        self._changes = 0

    def get(self, key: str) -> Version | None | Unknown:
        """What was remembered for ``key`` within the last ``ttl`` seconds, else ``UNKNOWN``;
        an ``Unusable`` remembered is raised (a fresh copy: raising mutates it)."""
        hit = self._items.get(key)
        if hit is None or time.monotonic() >= hit[0]:
            return UNKNOWN
        found = hit[1]
        if isinstance(found, Unusable):
            raise Unusable(found.errno, found.strerror, found.filename)
        return found

    def token(self) -> int:
        """Take before asking the store; give to ``put`` with the answer."""
        with self._lock:
            return self._changes

    def put(self, key: str, found: Version | Unusable | None, token: int) -> None:
        """Remember ``found`` unless some key was forgotten since ``token`` was taken."""
        with self._lock:
            if token == self._changes:
                if len(self._items) >= MAX_KEYS:
                    self._items.clear()
                self._items[key] = (time.monotonic() + self.ttl, found)

    def forget(self, key: str) -> None:
        with self._lock:
            self._changes += 1
            self._items.pop(key, None)

    def clear(self) -> None:
        """Forget every key (a directory was renamed: every key below it changed)."""
        with self._lock:
            self._changes += 1
            self._items.clear()


Versions = Remembered | SharedVersions  # what a storage remembers versions in (one worker's, or N workers')
