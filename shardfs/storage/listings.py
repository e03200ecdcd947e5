"""Listings of prefixes remembered for a short time, for both ``Storage`` implementations.

Every readdir, every group's children and every array's stored shards are a listing; against
an object store each costs one LIST request per 1000 entries. ``Listings`` keeps the listings
made in the last ``ttl`` seconds (the mount's entry timeout), least recently used out first,
within ``max_bytes`` in total. A listing is kept compactly: its names joined in one string and
one flag byte per entry (about 1 + len(name) bytes an entry, so a prefix of 100k shards named
``c/0/12345`` costs about 600 kB); a listing larger than a quarter of ``max_bytes`` is never
kept (it is listed again, page by page, each time: bounded memory wins over requests).

A writer's ``forget(key)`` drops the listings of every prefix above ``key`` (a new key may create
prefixes up to the root; a deleted one may empty them), and invalidates the listings being
fetched at that moment: they may predate the change (the same token scheme as ``Remembered``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

from shardfs.base.lru import SizedLRU
from shardfs.storage import Entry

DEFAULT_BYTES = 32 << 20  # all listings kept at once
KEPT_OVERHEAD = 200  # bytes a kept listing costs besides its names and flags
PAGE = 1000  # entries per page of a listing served from memory


class _Kept:
    """One listing: names joined by ``/`` (never in a name), ``flags[i]`` 1 for a directory."""

    __slots__ = ("expires", "names", "flags")

    def __init__(self, expires: float, names: str, flags: bytes) -> None:
        self.expires, self.names, self.flags = expires, names, flags

    @property
    def size(self) -> int:
        return KEPT_OVERHEAD + len(self.names) + len(self.flags)

    def flag(self, name: str) -> int | None:
        """1 if ``name`` is a directory entry, 0 a file, None if not listed."""
        names = self.names
        if not self.flags or not name:
            return None
        if names == name or names.startswith(name + "/"):
            at = 0
        else:  # "/name/" inside, or "/name" at the end (no copy of ``names``)
            at = names.find(f"/{name}/") + 1 or (len(names) - len(name) if names.endswith("/" + name) else 0)
            if not at:
                return None
        return self.flags[names.count("/", 0, at)]

    def pages(self) -> Iterator[list[Entry]]:
        names = self.names.split("/") if self.flags else []
        for start in range(0, len(names), PAGE):
            yield [Entry(n, bool(f)) for n, f in zip(names[start:start + PAGE], self.flags[start:start + PAGE])]


class Listings:
    """``prefix -> entries`` for ``ttl`` seconds within ``max_bytes`` (thread-safe); ``ttl`` 0
    keeps nothing (every listing asks the source)."""

    def __init__(self, ttl: float, max_bytes: int = DEFAULT_BYTES) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._kept: SizedLRU[str, _Kept] = SizedLRU(max_bytes, lambda k: k.size)
        self._lock = threading.Lock()
        self._changes = 0

    def list(self, prefix: str, fetch: Callable[[str], Iterator[list[Entry]]]) -> Iterator[list[Entry]]:
        """The pages of ``prefix``: from memory if listed within ``ttl``, else ``fetch(prefix)``'s,
        kept when consumed to the end (and small enough, and no key forgotten meanwhile)."""
        prefix = prefix.strip("/")
        with self._lock:
            hit = self._fresh(prefix)
            token = self._changes
        if hit is not None:
            yield from hit.pages()
            return
        if self.ttl <= 0:
            yield from fetch(prefix)
            return
        names: list[str] | None = []
        flags = bytearray()
        size = KEPT_OVERHEAD
        for page in fetch(prefix):
            if names is not None:
                size += sum(len(e.name) + 2 for e in page)
                if size > self.max_bytes // 4:
                    names = None
                else:
                    names.extend(e.name for e in page)
                    flags.extend(e.is_dir for e in page)
            yield page
        if names is not None:
            kept = _Kept(time.monotonic() + self.ttl, "/".join(names), bytes(flags))
            with self._lock:
                if token == self._changes:
                    self._kept.put(prefix, kept)

    def _fresh(self, prefix: str) -> _Kept | None:
        """The kept listing of ``prefix`` if still within ``ttl`` (the lock is held)."""
        hit = self._kept.get(prefix)
        if hit is not None and time.monotonic() >= hit.expires:
            self._kept.drop(prefix)
            return None
        return hit

    def is_dir(self, key: str) -> bool | None:
        """What the kept listings tell of ``key`` being a directory/prefix with entries: True
        if its own listing has entries, else its parent's entry for it; None if they do not
        tell (then only the source does)."""
        parent, _, name = key.strip("/").rpartition("/")
        with self._lock:
            own = self._fresh(key.strip("/"))
            if own is not None and own.flags:
                return True
            above = self._fresh(parent)
        flag = above.flag(name) if above is not None else None
        return None if above is None else bool(flag)

    def forget(self, key: str) -> None:
        """Drop the listings of ``key`` and of every prefix above it (the root's too), and the
        ones being fetched now."""
        parts = key.strip("/").split("/")
        with self._lock:
            self._changes += 1
            for n in range(len(parts) + 1):
                self._kept.drop("/".join(parts[:n]))

    def clear(self) -> None:
        """Drop every listing (a directory was renamed)."""
        with self._lock:
            self._changes += 1
            self._kept.clear()

    @property
    def used(self) -> int:
        """Bytes the kept listings cost (what ``max_bytes`` bounds)."""
        return self._kept.used

    @property
    def hits(self) -> int:
        """Listings served from memory (``shardfs status``: a ``Counted`` cache)."""
        return self._kept.hits

    @property
    def misses(self) -> int:
        """Listings asked of the source although kept ones were looked for."""
        return self._kept.misses
