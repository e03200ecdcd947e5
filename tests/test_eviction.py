"""The eviction order of the memory caches (``shardfs.base.eviction``), in-process, against a
plain least-recently-used cache as the reference: a cyclic sweep over more than memory holds
(readers of an array in C order) keeps part of it, where LRU keeps none; a skewed workload is
served as LRU serves it; a workload that moves on is kept whole once it fits."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Hashable, Iterable

from shardfs.base.eviction import Eviction
from shardfs.reads.rangecache import RangeCache
from shardfs.storage import Version

SHARD = 1000  # bytes of a range (a shard fetched whole)


def sweeps(readers: int = 4, shards: int = 12, passes: int = 4, chunks: int = 8,
           seed: int = 0) -> list[tuple[int, int]]:
    """The shards ``readers`` read, interleaved at random: each sweeps its own plane of
    ``shards`` ``passes`` times (zarr 2.18 reading a slab in C order: one chunk row a pass),
    ``chunks`` chunk files of a shard at each visit."""
    rng = random.Random(seed)
    left = {r: [(r, s) for _ in range(passes) for s in range(shards) for _ in range(chunks)][::-1]
            for r in range(readers)}
    out = []
    while left:
        r = rng.choice(sorted(left))
        out.append(left[r].pop())
        if not left[r]:
            del left[r]
    return out


def skewed(keys: int = 200, length: int = 5000, seed: int = 0) -> list[int]:
    """References with Zipf's law (exponent 1): a few keys read often, most seldom."""
    rng = random.Random(seed)
    return rng.choices(range(keys), weights=[1 / (k + 1) for k in range(keys)], k=length)


def lru_misses(trace: Iterable[Hashable], held: int) -> int:
    """The misses of a least-recently-used cache of ``held`` values over ``trace``."""
    kept: OrderedDict[Hashable, None] = OrderedDict()
    misses = 0
    for key in trace:
        if key in kept:
            kept.move_to_end(key)
            continue
        misses += 1
        kept[key] = None
        if len(kept) > held:
            kept.popitem(last=False)
    return misses


class Cache:
    """A cache of ``held`` values of one byte each in the order of an ``Eviction``."""

    def __init__(self, held: int) -> None:
        self.order: Eviction[Hashable] = Eviction(held)
        self.kept: set[Hashable] = set()

    def misses(self, trace: Iterable[Hashable]) -> int:
        misses = 0
        for key in trace:
            if key in self.kept:
                self.order.used(key)
                continue
            misses += 1
            self.kept.add(key)
            self.order.added(key, 1)
            while len(self.kept) > self.order.max_bytes:
                victim = self.order.victim()
                assert victim != key
                self.order.removed(victim)
                self.kept.remove(victim)
        return misses


def test_a_cyclic_sweep_over_more_than_memory_keeps_part_of_it():
    """Four readers sweeping 48 shards through memory for 38: LRU fetches every shard at every
    visit (192 of 192, or nearly); the cache fetches at most two thirds of that."""
    for seed in range(4):
        trace = sweeps(seed=seed)
        lru = lru_misses(trace, 38)
        assert lru >= 188
        cache = Cache(38)
        assert cache.misses(trace) <= lru * 2 // 3
        assert cache.order.randomly


def test_one_reader_sweeping_more_than_memory_holds_fetches_less():
    """One reader's plane of 12 shards swept 4 times through memory for 10: LRU 48 fetches,
    the cache at most 36."""
    trace = sweeps(readers=1)
    assert lru_misses(trace, 10) == 48
    assert Cache(10).misses(trace) <= 36


def test_a_skewed_workload_is_served_as_lru_serves_it():
    """Where least recently used is the better choice, the cache keeps it: at most 1% more misses."""
    for seed in range(3):
        trace = skewed(seed=seed)
        cache = Cache(38)
        assert cache.misses(trace) <= lru_misses(trace, 38) * 101 // 100
        assert not cache.order.randomly


def test_a_workload_that_moves_on_is_kept_whole_once_it_fits_and_lru_comes_back():
    """After a cyclic sweep (a random victim), 30 other keys read over and over are all kept
    after their first passes (no miss in the last three), and a skewed workload after them brings
    least recently used back."""
    cache = Cache(38)
    cache.misses(sweeps())
    assert cache.order.randomly
    new = [("new", k) for k in range(30)]
    cache.misses(new * 5)
    assert cache.misses(new * 3) == 0
    cache.misses(skewed())
    assert not cache.order.randomly


def test_a_random_victim_is_never_one_of_the_newest_quarter():
    cache = Cache(38)
    cache.misses(sweeps())
    assert cache.order.randomly
    newest = list(cache.order._kept.order)[-9:]  # (the newest quarter of 38 values, and the last)
    victims = {cache.order.victim() for _ in range(2000)}
    assert victims.isdisjoint(newest) and len(victims) == 38 - 9 - 1


def test_range_cache_keeps_part_of_a_cyclic_sweep():
    """The same four readers through a ``RangeCache`` of 38 shards' bytes: each chunk file read
    is a ``get`` of its part of the shard, a miss fetches the shard whole (``put``)."""
    cache = RangeCache(38 * SHARD)
    data = bytes(SHARD)
    version = Version('"e"', SHARD, 0)
    fetches = 0
    for n, (reader, shard) in enumerate(sweeps()):
        where = f"s3://b/a/c/{reader}/{shard}"
        if cache.get(where, version, (n % 8) * 100, 100, disk=False) is None:
            fetches += 1
            cache.put(where, version, 0, data)
    assert fetches <= lru_misses(sweeps(), 38) * 2 // 3
    assert cache.used <= 38 * SHARD
