"""Chunk reads from an object store: ranged GETs pinned to the shard version their index gave.

A chunk costs one ranged GET conditioned on the shard's ETag (If-Match), so a file never mixes
two versions of a shard: a shard replaced since its index was read answers 412, raised as
``VersionMismatch`` (the view re-reads the index and tries again). Every chunk file's bytes are
fetched at open and served from memory. A swept shard is fetched whole in one GET
(``ReadAhead``: a first open of a shard at its first chunk, where a sweep in C order starts, so
a shard read whole chunk by chunk costs its index and one GET; an open of the chunk stored
right after the last one opened of its shard; 3 opens of it among the last; chained: a sweep
moving on to the next shard). Scattered reads seldom fetch a shard whole (that costs more than
the chunks they read). The
chunks opened while that GET is in flight wait for it instead of asking for their own bytes.
Fetched ranges are kept in a ``RangeCache`` (bounded memory, optionally a disk cache keyed by
ETag), so the following chunks of a swept shard, and chunks opened again, cost no request: a
memory hit is served inline, the disk cache is read in a worker thread (``put`` never waits).
Requests run on the storage's asyncio loop thread (``LoopThread.trio_run``): only the opening
trio task waits. Fetched bytes are never copied: a response's body is cached as obstore gave
it, and a chunk file served as it is stored holds a view of the cached range (a chunk to
decode is copied out: what the ``ChunkCache`` keeps never pins a shard's bytes).

Of N workers of a read-only mount (``shared``: ``shardfs.storage.sharedshards``), a shard fetched
whole is kept there, where every worker finds it (``holds``, ``kept_index``): not in this worker's
memory, which keeps the ranges fetched alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from shardfs.config import ReadConfig
from shardfs.reads.chunkcache import ChunkCache
from shardfs.reads.rangecache import RangeCache
from shardfs.reads import ReadAhead, ReadHandle, Reads
from shardfs.shards.shard import CorruptShard, Extent, table_of_whole
from shardfs.storage import Range, Version, VersionMismatch
from shardfs.storage import Storage
from shardfs.storage.sharedshards import SharedShards
from shardfs.storage.requests import Buffer, ObjectRequests
from shardfs.base.threads import blocking, blocking_read

if TYPE_CHECKING:
    import numpy as np

    from shardfs.base.attrs import Attr
    from shardfs.format.shardfile import ShardFormat

log = logging.getLogger("shardfs")

DEFAULT_CACHE_BYTES = ReadConfig.cache_size  # -o cache_size


class ObjectReads(Reads):
    """``Reads`` over a source reached through obstore (an object store, a web server) and its
    ``requests`` (``shardfs.storage.requests``: see the module docstring); ``cache`` defaults to
    ``RangeCache(DEFAULT_CACHE_BYTES)``, memory only; ``shared``: where the N workers of a
    read-only mount keep the shards fetched whole."""

    prefetches = True

    def __init__(self, source: Storage, requests: ObjectRequests, chunk_cache: ChunkCache,
                 cache: RangeCache | None = None, shared: SharedShards | None = None) -> None:
        super().__init__(chunk_cache, ReadAhead(chained=True, starts=True, adjacent=True))
        self.source = source
        self.requests = requests
        self.cache = cache if cache is not None else RangeCache(DEFAULT_CACHE_BYTES)
        self.shared = shared
        self._fetching: dict[tuple[str, Version], trio.Event] = {}  # whole shards being fetched
        self._refused = False  # the kernel refused to write ``shared`` (logged once)

    async def _stored(self, ext: Extent, ahead: bool) -> bytes:
        return bytes(await self._buffer(ext, ahead))

    async def _stored_handle(self, ino: int, attr: Attr, ext: Extent, ahead: bool) -> ReadHandle:
        return ReadHandle(ino, attr, data=await self._buffer(ext, ahead))

    async def _buffer(self, ext: Extent, ahead: bool) -> Buffer:
        """``_stored``, as a read-only buffer that may share the cached range's memory."""
        where = self.source.describe(ext.key)
        shard = (ext.key, ext.version)
        fetching = self._fetching.get(shard)
        if fetching is not None:
            await fetching.wait()
        data = self.cache.get(where, ext.version, ext.offset, ext.nbytes, disk=False)
        if data is None and self.shared is not None:
            data = self.shared.get(where, ext.version, ext.offset, ext.offset + ext.nbytes)
        if data is None and self.cache.disk_dir is not None:
            data = await blocking(self.cache.get, where, ext.version, ext.offset, ext.nbytes)
        if data is not None:
            self.cache.hits += 1
            return data
        self.cache.misses += 1
        if ahead and shard not in self._fetching:
            done = self._fetching[shard] = trio.Event()
            try:
                whole = await self._get(ext, Range(0, ext.version.size))
            finally:
                del self._fetching[shard]
                done.set()
            self._keep_whole(where, ext.version, whole)
            return memoryview(whole)[ext.offset: ext.offset + ext.nbytes]
        data = await self._get(ext, Range(ext.offset, ext.nbytes))
        self.cache.put(where, ext.version, ext.offset, data)
        return data

    def _keep_whole(self, where: str, version: Version, data: Buffer) -> None:
        """Keep all of ``version`` of ``where``, fetched: where every worker finds it, if shared;
        in this worker's cache if not (and in the disk cache, if there is one). The kernel's
        first refusal to write the shared shards is logged (one line a worker): the shards
        this worker fetches whole are then kept in its cache, which the others do not see."""
        held = False
        if self.shared is not None:
            try:
                held = self.shared.put(where, version, data)
            except OSError as e:
                if not self._refused:
                    log.warning("the shards fetched whole cannot be kept where every worker finds them "
                                "(%s, %s bytes): kept in this worker's memory", e.strerror, len(data))
                self._refused = True
        if not held or self.cache.disk_dir is not None:
            self.cache.put(where, version, 0, data)

    def room_ahead(self, size: int) -> int:
        room = self.cache.max_bytes if self.shared is None else self.shared.ring
        return room // 2 // max(size, 1)

    def kept(self, key: str, version: Version) -> bool:
        """With a disk cache only indexes are fetched ahead; without one, a shard is kept while
        one range in memory holds it whole (a second sweep of an array larger than the cache
        finds its shards evicted) or when memory could not keep it anyway."""
        return self.cache.disk_dir is not None or self.holds(key, version) \
            or not self.cache.lacks(self.source.describe(key), version)

    def holds(self, key: str, version: Version) -> bool:
        """Whether all of ``version`` of the shard at ``key`` is kept where every worker finds it."""
        return self.shared is not None and self.shared.holds(self.source.describe(key), version)

    def kept_index(self, key: str, fmt: ShardFormat) -> tuple[Version, np.ndarray] | None:
        """The index of the shard at ``key`` and its version, parsed from its bytes kept where
        every worker finds them, with no request; None if they are not kept (or are corrupt: the
        worker that reads the shard logs it)."""
        if self.shared is None:
            return None

        def table(found: Version, data: memoryview) -> tuple[Version, np.ndarray] | None:
            try:
                return found, table_of_whole(self.source, key, fmt, found, data)
            except CorruptShard:
                return None

        return self.shared.whole(self.source.describe(key), table)

    async def keys_below(self, prefix: str, most: int) -> list[str] | None:
        return await blocking_read(self.source.keys_below, prefix, most)

    async def fetch_whole(self, key: str) -> tuple[bytes, Version] | None:
        if self.cache.disk_dir is not None:
            return None
        data, version = await self.requests.loop.trio_run(self.requests.aread_all(key, copy=False))
        self._keep_whole(self.source.describe(key), version, data)
        return data, version

    async def _get(self, ext: Extent, rng: Range) -> Buffer:
        """One GET of ``rng`` of the shard, If-Match its version; ``VersionMismatch`` if the
        shard was replaced or removed."""
        try:
            read = self.requests.aread(ext.key, [rng], ext.version, copy=False)
            return (await self.requests.loop.trio_run(read))[0]
        except FileNotFoundError:
            raise VersionMismatch(self.source.describe(ext.key)) from None

