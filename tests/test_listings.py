"""``Listings`` (shardfs.storage.listings): what is kept, for how long, within which bound.

Driven with a source of pages that counts how often it is listed (the storage contract and
the mounts test the two real stores; here the bound is checked at sizes a server would take
minutes to fill: a prefix of 100k shards)."""

from __future__ import annotations

import time
from typing import Iterator

from shardfs.storage import Entry
from shardfs.storage.listings import KEPT_OVERHEAD, Listings


class Pages:
    """``n`` shard names (``0`` .. ``n-1``) and one sub-prefix ``sub``, in pages of 1000."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, prefix: str) -> Iterator[list[Entry]]:
        self.calls += 1
        entries = [Entry(str(i), False) for i in range(self.n)] + [Entry("sub", True)]
        for start in range(0, len(entries), 1000):
            yield entries[start:start + 1000]


def listing(cache: Listings, prefix: str, source: Pages) -> list[Entry]:
    return [e for page in cache.list(prefix, source) for e in page]


def names_bytes(n: int) -> int:
    """What a listing of ``Pages(n)`` costs kept: its names, ``/`` between them, one flag each."""
    return KEPT_OVERHEAD + sum(len(str(i)) for i in range(n)) + len("sub") + n + (n + 1)


def test_a_listing_of_100k_shards_is_kept_compactly_and_served_again_without_listing():
    source = Pages(100_000)
    cache = Listings(10)
    first = listing(cache, "a/c", source)
    assert len(first) == 100_001 and first[-1] == Entry("sub", True)
    assert listing(cache, "a/c/", source) == first
    assert source.calls == 1
    assert cache.used == names_bytes(100_000) == 689_094  # about 7 bytes an entry
    assert (cache.is_dir("a/c/sub"), cache.is_dir("a/c/17"), cache.is_dir("a/c/none"), cache.is_dir("b/x")) == \
        (True, False, False, None)


def test_a_listing_larger_than_a_quarter_of_the_bound_is_not_kept():
    source = Pages(100_000)
    cache = Listings(10, max_bytes=4 * names_bytes(100_000) - 4)
    assert len(listing(cache, "a/c", source)) == 100_001
    assert len(listing(cache, "a/c", source)) == 100_001
    assert (source.calls, cache.used) == (2, 0)


def test_the_least_recently_used_listings_go_first_within_the_bound():
    one = names_bytes(1000)
    cache = Listings(10, max_bytes=4 * one + 4)  # four listings (each within a quarter)
    source = Pages(1000)
    for prefix in ("p0", "p1", "p2", "p3", "p0", "p4"):  # p0 used again: p1 is the oldest when p4 comes
        listing(cache, prefix, source)
    assert (source.calls, cache.used) == (5, 4 * one)
    listing(cache, "p1", source)
    assert source.calls == 6
    listing(cache, "p0", source)
    listing(cache, "p4", source)
    assert source.calls == 6


def test_a_change_below_a_prefix_forgets_the_listings_above_it_and_those_being_made():
    source = Pages(3)
    cache = Listings(10)
    for prefix in ("", "a", "a/c", "a/c/0", "b"):
        listing(cache, prefix, source)
    cache.forget("a/c/0/1")
    for prefix in ("", "a", "a/c", "a/c/0", "b"):
        listing(cache, prefix, source)
    assert source.calls == 5 + 4  # "b" is not above the key: still kept
    pages = cache.list("x", source)
    next(pages)  # being listed when a key changes: not kept (it may predate the change)
    cache.forget("y")
    list(pages)
    listing(cache, "x", source)
    assert source.calls == 9 + 2


def test_a_listing_is_asked_again_after_the_ttl_and_never_kept_with_ttl_0():
    source = Pages(3)
    cache = Listings(0.2)
    listing(cache, "a", source)
    listing(cache, "a", source)
    time.sleep(0.25)
    listing(cache, "a", source)
    assert source.calls == 2
    off = Listings(0)
    listing(off, "a", source)
    listing(off, "a", source)
    assert (source.calls, off.used) == (4, 0)
