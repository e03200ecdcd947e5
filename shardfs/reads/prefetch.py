"""The object-store read-ahead: shards fetched whole ahead of a client sweeping an array, and
the indexes of an array's shards read ahead of scattered reads (``Reads.prefetches``: object
sources only; a local source has the kernel read a swept shard ahead, ``shardfs.reads.local``).

The view tells it of each chunk looked up (``walk_on``, ``indexes_ahead``) and opened
(``note_shard``); it fetches in the background (trio system tasks), caching the indexes of what
it fetched in the mount's ``ShardIndexes`` (an open meanwhile waits for the fetch as for an index
read) and the bytes in the read path (``Reads.fetch_whole``). A failure is left for the opens'
own reads (logged at debug level). Runs on the trio thread.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import trio

from shardfs.format.layout import c_coords, c_linear
from shardfs.shards import shard as shard_mod
from shardfs.shards.indexes import SHARD_KEYS_KEPT, Sharded, ShardIndexes
from shardfs.shards.shard import Extent, IndexCache
from shardfs.storage import Storage
from shardfs.base.threads import blocking_read

if TYPE_CHECKING:
    from shardfs.reads import Reads

log = logging.getLogger("shardfs")

PREFETCH_SHARDS = 6  # shards after a swept one fetched whole ahead, at least (objects; see ``_prefetch_after``)
PREFETCH_AT_ONCE = 6  # of those in flight at once; the others wait their turn, in the order asked
PREFETCH_MAX = 32  # shards after a swept one fetched ahead, at most (a sweep of a small region wastes no more)
INDEXES_AHEAD_MAX = 4096  # arrays with more stored shards never have their indexes read ahead
INDEXES_AHEAD_AT_ONCE = 8  # of those in flight at once (more slow the opens meanwhile: measured)
INDEXES_AHEAD_OTHER_KEYS = 16  # keys below an array besides its shards (zarr.json...) listed for that


def home_of(linear: int, count: int) -> int:
    """Of ``count`` workers serving a remote source, the slot of the one that fetches, caches
    and reads ahead the shard at ``linear`` (C order in its array's shard grid): its *home*
    (``shardfs.kernel.homes`` routes its chunks' requests there)."""
    return linear % count


class Swept(Sharded, Protocol):
    """What the read-ahead keeps on an array (the tree's ``ArrayNode``): the shards (C order)
    whose next ones were fetched ahead, and whether its indexes were read ahead."""

    covered: set[int]
    indexes_ahead: bool


class _Visit(NamedTuple):
    """The shard of an array opened last (``Prefetch.note_shard``)."""

    at: int  # its position in the shard grid, C order
    from_before: bool  # the shard opened before it was the one just before it
    asked: bool  # the shards after it were asked for during this visit
    ext: Extent  # a chunk opened in it this visit (the shard's version and size)


class Prefetch:
    """The read-ahead of one mount over ``source``, fetching through ``reads`` and caching the
    indexes it reads in ``index_cache``, the one ``indexes`` keeps."""

    def __init__(self, source: Storage, reads: Reads, indexes: ShardIndexes, index_cache: IndexCache) -> None:
        self.source = source
        self.reads = reads
        self.indexes = indexes
        self.index_cache = index_cache
        self._ahead: deque[tuple[Swept, str]] = deque()  # shards to fetch ahead of a sweep, in turn
        self._prefetching = 0  # shards being fetched ahead of a sweep
        self._last_shard: dict[str, _Visit] = {}  # array path -> its shard opened last (``note_shard``)
        self._slot, self._count = 0, 1  # this worker's slot of those serving the mount (``share``)

    def share(self, slot: int, count: int) -> None:
        """This read-ahead is worker ``slot``'s of ``count`` serving a remote source: only the
        shards homed here are fetched ahead (``home_of``), after a sweep seen in the opens this
        worker serves, of every shard (those of others' shards too: those kept where every
        worker finds them, ``shardfs.kernel.homes``). The kernel gives each worker some of a
        sweep's opens, so the shard opened here before this one may be up to ``count`` before it."""
        self._slot, self._count = slot, count

    def _comes_from(self, last: int, at: int) -> bool:
        """Whether a sweep that opened the shard at ``last`` here came on to the one at ``at``
        (C order: the one just before it; of N workers, one of the ``count`` before it)."""
        return at - self._count <= last < at

    def _mine(self, at: int) -> bool:
        return home_of(at, self._count) == self._slot

    def walking(self, arr: Swept) -> bool:
        """True if a shard of ``arr`` was opened (so a lookup may walk on from it: ``walk_on``)."""
        return arr.path in self._last_shard

    def note_shard(self, arr: Swept, coords: tuple[int, ...], ext: Extent) -> None:
        """A chunk of ``arr`` at ``ext`` was opened: when the client sweeps its shard
        (``ReadAhead.swept``: 3 of its chunks among the last opens, so a client reading two
        chunks of each of a few shards is no walk) and came to it from the shard just before it
        in C order of the shard grid (of N workers, one of the ``count`` before it: ``share``)
        (the order a sweep of the chunk grid in C order reaches shards, also when its rows cross
        several), it walks the array: fetch the shards after it ahead (``_prefetch_after``),
        once per visit of the shard until all of them were (a sweep whose rows cross several
        shards visits each many times: a visit after that costs no look at the shards after).
        The shard last opened is remembered for ``walk_on``."""
        layout = arr.shown.layout
        at = c_linear(layout.locate(coords)[0], layout.shard_grid)
        last = self._last_shard.get(arr.path)
        if last is None or last.at != at:
            if len(self._last_shard) >= SHARD_KEYS_KEPT:
                self._last_shard.clear()
            last = self._last_shard[arr.path] = _Visit(at, last is not None and self._comes_from(last.at, at), False,
                                                       ext)
        if last.from_before and not last.asked and at not in arr.covered and self.reads.ahead.swept(ext):
            self._last_shard[arr.path] = _Visit(at, True, True, ext)
            self._prefetch_after(arr, at, ext.version.size)

    def walk_on(self, arr: Swept, shard: tuple[int, ...]) -> None:
        """A chunk of ``shard`` is looked up or opened (object sources). If it is ``_cold``
        (its index never read, or its bytes evicted since), and the shard opened last in
        ``arr`` is the one before it in C order and was swept (``ReadAhead.swept``), the client
        walks on from that one: zarr 2.18 reading the array row by row crosses from the first shard to the second
        this way. Then fetch this shard whole in one GET (which also tells its index) together
        with the shards after it (``_prefetch_after``), instead of reading its index first,
        then the rest of it, and only then the shards after it."""
        last = self._last_shard[arr.path]
        at = c_linear(shard, arr.shown.layout.shard_grid)
        if not self._mine(at) or not self._comes_from(last.at, at) \
                or not self._cold(self.indexes.shard_key(arr, shard)) or not self.reads.ahead.swept(last.ext):
            return
        # a shard read before and evicted since: what ``arr.covered`` says was fetched ahead
        # of the sweep may be gone too (a sweep again of an array larger than the cache)
        arr.covered.clear()
        self._prefetch_after(arr, last.at, last.ext.version.size)

    def _cold(self, key: str) -> bool:
        """Whether fetching the shard at ``key`` whole ahead saves its opens a request: it is
        not being read, and its index was never read or its bytes are no longer kept
        (``Reads.kept``)."""
        if self.indexes.reading(key):
            return False
        version = self.index_cache.latest(key)
        return version is None or not self.reads.kept(key, version)

    def _prefetch_after(self, arr: Swept, at: int, size: int) -> None:
        """Fetch the shards after the one at ``at`` (linear, C order) in the background, each
        whole in one GET (with a disk cache: their indexes alone, which tell the ETag the
        cached chunks are under), those that are ``_cold``:
        as many as a plane of chunks crosses (``prod(shard_grid[1:])``, at least
        ``PREFETCH_SHARDS``), since a sweep in C order of the chunk grid comes back to the
        shards of one plane until it has read them all, then enters the next plane's, which are
        then fetched already; but no more than ``PREFETCH_MAX`` (what a sweep of a small region
        may fetch for nothing) nor than ``Reads.room_ahead`` shards of ``size``.
        ``PREFETCH_AT_ONCE`` are fetched at once, the others wait their turn in C order (the
        order the sweep needs them); of N workers (``share``), those of them homed here (each
        worker its share: together they fetch what one worker would).
        Their index is cached from the bytes fetched; an open meanwhile waits for the fetch as
        for an index read. The shards after ``at`` count as
        asked for (``arr.covered``) from then on; those fetched are named in one debug line."""
        grid = arr.shown.layout.shard_grid
        if len(arr.covered) >= SHARD_KEYS_KEPT:
            arr.covered.clear()
        arr.covered.add(at)
        lead = min(max(PREFETCH_SHARDS, math.prod(grid[1:])), PREFETCH_MAX, self.reads.room_ahead(size))
        asked = []
        for nxt in range(at + 1, min(at + 1 + lead, math.prod(grid))):
            if not self._mine(nxt):  # (another worker's: its home fetches it ahead of its own opens)
                continue
            key = self.indexes.shard_key(arr, c_coords(nxt, grid))
            if not self._cold(key):
                continue
            self.indexes.begin(key)
            self._ahead.append((arr, key))
            asked.append(key)
        if asked:
            log.debug("%s: a sweep past shard %d of its grid: %s fetched ahead", self.source.describe(arr.path), at,
                      ", ".join(asked))
        self._next_prefetch()

    def _next_prefetch(self) -> None:
        """Start fetching the shards asked for by ``_prefetch_after`` in turn, up to
        ``PREFETCH_AT_ONCE`` at once."""
        while self._ahead and self._prefetching < PREFETCH_AT_ONCE:
            arr, key = self._ahead.popleft()
            try:
                trio.lowlevel.spawn_system_task(self._prefetch, arr, key)
            except RuntimeError:  # the trio run is ending: not fetched
                self.indexes.end(key)
                continue
            self._prefetching += 1

    async def _prefetch(self, arr: Swept, key: str) -> None:
        """Fetch the shard at ``key`` whole and cache its index (see ``_prefetch_after``); a
        failure is left for the opens' own reads to meet (logged at debug level)."""
        fmt = arr.shown.layout.index
        try:
            assert fmt is not None  # only the shards of a sharded array are fetched ahead
            fetched = await self.reads.fetch_whole(key)
            if fetched is not None:
                data, version = fetched
                self.index_cache.put(key, version, shard_mod.table_of_whole(self.source, key, fmt, version, data))
            else:
                found = await blocking_read(shard_mod.read_index_sync, self.source, key, fmt)
                if found is not None:
                    self.index_cache.put(key, *found)
        except Exception as e:  # noqa: BLE001 - a background fetch never ends the daemon
            log.debug("%s: not fetched ahead: %r", self.source.describe(key), e)
        finally:
            self._prefetching -= 1
            self.indexes.end(key)
            self._next_prefetch()

    def indexes_ahead(self, arr: Swept, shard: tuple[int, ...]) -> None:
        """A chunk of ``shard`` other than its first is looked up (object sources): if the
        shard's index is neither cached nor being read, the client reads scattered chunks (a
        sweep in C order comes to a shard at its first chunk, which fetches the shard whole),
        each cold one costing two round trips (its index, then its bytes). So read the indexes
        of all the array's stored shards ahead, in the background, once per array version
        (``_read_indexes_ahead``): the scattered reads that follow cost one round trip."""
        key = self.indexes.shard_key(arr, shard)
        if self.index_cache.latest(key) is not None or self.indexes.reading(key) or arr.shown.layout.index is None:
            return
        arr.indexes_ahead = True
        trio.lowlevel.spawn_system_task(self._read_indexes_ahead, arr)

    async def _read_indexes_ahead(self, arr: Swept) -> None:
        """Read the indexes of the stored shards of ``arr``, ``INDEXES_AHEAD_AT_ONCE`` at a time
        (``ShardIndexes.read_indexes``: through ``shard_table``, sharing a read in flight with the
        opens that need it), if a listing of at most ``INDEXES_AHEAD_MAX`` keys names them and
        their tables fit a quarter of the index cache (of N workers, the shards homed here:
        ``share``); a failure is left for the opens' own reads (logged at debug level)."""
        layout = arr.shown.layout
        table_bytes = 16 * int(np.prod(layout.chunks_per_shard))  # (offset, nbytes) uint64 per inner chunk
        most = min(INDEXES_AHEAD_MAX, self.index_cache.max_bytes // 4 // table_bytes)
        try:
            keys = await self.reads.keys_below(arr.path, most + INDEXES_AHEAD_OTHER_KEYS)
            shards = [c for c in map(layout.keys.parse, keys or ()) if c is not None and layout.shard_in_grid(c)
                      and self._mine(c_linear(c, layout.shard_grid))]
            if keys is not None and len(shards) <= most:
                await self.indexes.read_indexes(arr, shards, INDEXES_AHEAD_AT_ONCE)
        except Exception as e:  # noqa: BLE001 - a background read never ends the daemon
            log.debug("%s: indexes not read ahead: %r", self.source.describe(arr.path), e)
