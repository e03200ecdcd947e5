"""Which kept value goes first when a size-bounded cache is full: the least recently used, or a
random one, whichever a shadow of the other says would have missed less.

Least recently used is the right choice while what was used recently is used again soon, and
the worst when a cache is swept cyclically over more than it holds: readers sweeping an array
in C order come back to a plane of shards once a chunk row, and LRU evicts each shard just
before its next use, so every visit fetches it again (measured: four zarr 2.18 readers of an
S3 array of 48 shards through 38 shards' worth of memory fetched it 3.3 times). A random
victim among the oldest three quarters keeps part of such a sweep (the newest quarter is spared
so that a shard being read by a reader is not evicted under it): there 2.2-3.0 times against
2.0-4.5 (doc/BENCHMARKING.md; how far the readers drift apart moves it as much).

Neither choice is right for every workload, so the cache follows one and a shadow follows the
other over the same references (keys and sizes only, in ``max_bytes``): each reference one
side keeps and the other misses counts for the side that kept it, and once the shadow is
ahead by ``LEAD`` such references the two swap (the shadow starts again from what the cache
holds). Like ARC's ghost lists, the cache learns from the misses of the choice it did not make:
a workload that moves on moves the choice back.

Contract: ``used(key)`` (a kept value was read), ``added(key, size)`` (a value was kept: a miss,
never for a key kept already), ``removed(key)`` (a kept value was dropped, by its cache or by
``victim``'s choice), ``victim()`` (the key to evict next: never the one added last while
another is kept; ``KeyError`` if none is kept). Not thread-safe: the cache's lock holds.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)

LEAD = 4  # references the shadow must keep more than the cache before they swap
SPARED = 4  # of the kept values, the newest 1 / SPARED are never a random choice's victim


class _Side(Generic[K]):
    """Keys in use order (oldest first) with their sizes, and which way this side evicts."""

    def __init__(self, randomly: bool, rng: random.Random) -> None:
        self.order: OrderedDict[K, int] = OrderedDict()
        self.randomly = randomly
        self.rng = rng

    def victim(self) -> K:
        """The key to evict: the oldest, or a random one of the oldest (never the newest)."""
        if not self.randomly or len(self.order) < 2:
            return next(iter(self.order))
        older = len(self.order) - 1
        return next(itertools.islice(self.order, self.rng.randrange(max(1, older - older // SPARED)), None))


class Eviction(Generic[K]):
    """The eviction order of one cache of ``max_bytes`` (see the module docstring)."""

    def __init__(self, max_bytes: int, seed: int = 0) -> None:
        self.max_bytes = max_bytes
        rng = random.Random(seed)
        self._kept: _Side[K] = _Side(False, rng)
        self._shadow: _Side[K] = _Side(True, rng)
        self._shadow_bytes = 0
        self._lead = 0  # references the shadow kept and the cache missed, less the other way round

    @property
    def randomly(self) -> bool:
        """True while the cache evicts a random one of its oldest values (else the oldest)."""
        return self._kept.randomly

    def used(self, key: K) -> None:
        """Kept value ``key`` was read: it is the most recently used."""
        self._kept.order.move_to_end(key)
        self._compare(True, self._shadow_has(key, self._kept.order[key]))

    def added(self, key: K, size: int) -> None:
        """Value ``key`` of ``size`` bytes is kept now (it was not: a miss)."""
        self._kept.order[key] = size
        self._compare(False, self._shadow_has(key, size))

    def removed(self, key: K) -> None:
        """Kept value ``key`` was dropped."""
        del self._kept.order[key]

    def victim(self) -> K:
        """The key to evict next."""
        return self._kept.victim()

    def _shadow_has(self, key: K, size: int) -> bool:
        """Whether the shadow held ``key``; it holds it now, as the most recently used."""
        order = self._shadow.order
        if key in order:
            order.move_to_end(key)
            return True
        order[key] = size
        self._shadow_bytes += size
        while self._shadow_bytes > self.max_bytes and len(order) > 1:
            self._shadow_bytes -= order.pop(self._shadow.victim())
        return False

    def _compare(self, kept: bool, shadowed: bool) -> None:
        """A reference the cache kept (``kept``) or missed, and the shadow likewise: swap the
        two once the shadow is ``LEAD`` ahead."""
        if kept == shadowed:
            return
        self._lead = max(-LEAD, min(LEAD, self._lead + (1 if shadowed else -1)))
        if self._lead < LEAD:
            return
        self._lead = 0
        self._kept.randomly, self._shadow.randomly = self._shadow.randomly, self._kept.randomly
        self._shadow.order = OrderedDict(self._kept.order)
        self._shadow_bytes = sum(self._shadow.order.values())
