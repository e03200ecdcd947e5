"""A least-recently-used map bounded by the total size of its values."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Protocol, TypedDict, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CacheCounts(TypedDict):
    """What ``shardfs status`` shows of one cache (``cache`` of the status document)."""

    hits: int
    misses: int
    bytes: int
    limit: int


class Counted(Protocol):
    """A cache that counts its hits and misses (``SizedLRU``, ``IndexCache``, ``RangeCache``, ``Listings``)."""

    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...


def counts(cache: Counted) -> CacheCounts:
    """``cache``'s counters as the status document shows them."""
    return {"hits": cache.hits, "misses": cache.misses, "bytes": cache.used, "limit": cache.max_bytes}


class SizedLRU(Generic[K, V]):
    """Keeps the most recently used values whose ``size`` sum stays within ``max_bytes``.

    The newest value is always kept, even if it alone exceeds the budget.
    """

    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self.hits = 0  # ``get`` calls that found their key (``shardfs status``)
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return item

    def put(self, key: K, item: V) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.used -= self._size(old)
        self._items[key] = item
        self.used += self._size(item)
        while self.used > self.max_bytes and len(self._items) > 1:
            _, dropped = self._items.popitem(last=False)
            self.used -= self._size(dropped)

    def clear(self) -> None:
        """Forget every value (the counters stay)."""
        self._items.clear()
        self.used = 0

    def drop(self, key: K) -> None:
        """Forget ``key`` (nothing if it is not kept)."""
        old = self._items.pop(key, None)
        if old is not None:
            self.used -= self._size(old)
