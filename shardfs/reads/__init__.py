"""The read path: open chunk files, read them, release them (mountpoint-s3's ``prefetch``).

``Opens`` (``shardfs.tree.opens``) resolves a chunk file to an ``Extent`` (a byte range of one version of one shard) and
asks ``Reads.open`` for a handle; ``read`` and ``release`` serve every read handle, also those
``Opens`` makes itself for metadata and staging files (``data``/``buffer``). One implementation
per read path, chosen once by ``shardfs.reads.factory.make_reads`` (the path the source's
``Storage.read_path`` names):

- ``shardfs.reads.local.LocalReads``: a descriptor per open chunk, ``pread`` into a reused buffer
  without waiting for the disk, the kernel asked to read a swept shard ahead;
- ``shardfs.reads.objects.ObjectReads``: a ranged GET per chunk conditioned on the shard's ETag,
  a swept shard fetched whole in one GET, fetched ranges kept in a bounded ``RangeCache``.

Contracts of ``Reads.open(ino, attr, ext, decode)``: ``VersionMismatch`` when the shard is no
longer at ``ext.version`` (``Opens`` reads its index again and tries again); a chunk stored in
another form than its file's (``decode`` given) is decoded once and kept in the ``ChunkCache``
by extent; other ``OSError`` are the errno for the client.

The public face (``__all__``): the types above, and what ``shardfs.app.compose`` builds the read
path with and the tree uses (``factory``, ``chunkcache``, ``prefetch``, ``rangecache``); the
object stores' read path (``objects``), which the homes of N workers ask for the shards kept for
every worker (``shardfs.kernel.homes``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from shardfs.reads.chunkcache import ChunkCache
from shardfs.shards.shard import Extent
from shardfs.writes.spill import SpillBuffer
from shardfs.storage import Version
from shardfs.base.threads import blocking

if TYPE_CHECKING:
    from shardfs.base.attrs import Attr

__all__ = ["ReadAhead", "ReadHandle", "Reads", "chunkcache", "factory", "objects", "prefetch", "rangecache"]
READ_AHEAD_AFTER = 3  # opens of chunks of one shard among the last READ_AHEAD_WINDOW opens
READ_AHEAD_WINDOW = 16  # before the rest of that shard is read ahead
READ_AHEAD_MAX = 64 << 20  # larger shards are never read ahead
WALK_OPENS = 3  # opens of a swept shard among the last opens before the shards after it are fetched ahead

Decode = Callable[[bytes], bytes]  # stored chunk bytes -> chunk file bytes (blocking; OSError if corrupt)


@dataclass
class ReadHandle:
    """An open chunk, metadata or staging file: bytes in memory, a shard byte range open as a
    descriptor (local sources), or a staging file's buffer (read as it is at each read), and
    the attributes of the version that was opened."""

    ino: int
    attr: Attr
    data: bytes | None = None
    buffer: SpillBuffer | None = None
    fd: int = -1
    offset: int = 0
    nbytes: int = 0


class ReadAhead:
    """Tells when a client sweeps a shard: ``note(ext)`` at every chunk open is True (once per
    visit of a shard version: a visit ends when no open among the last ``window`` was of that
    shard, and what was read ahead then may have been evicted since) when the rest of that
    shard is worth reading at once.

    Opens of chunks of one shard ``after`` times among the last ``window`` opens are a sweep
    (scattered reads rarely come back to a shard that soon); with ``chained``, so is the first
    open of a shard right after ``after`` opens of shards that were read ahead (a sweep moving
    on to the next shard); with ``starts``, so is an open of a shard's first chunk (``first``:
    position 0 of its index, where a sweep in C order starts) when no chunk of that shard is
    among the last opens; with ``adjacent``, so is an open of the chunk stored right after the
    last one opened of its shard (a sweep that started inside the shard; scattered reads
    seldom do that). Shards larger than ``max_bytes`` are never read ahead.
    """

    def __init__(self, after: int = READ_AHEAD_AFTER, chained: bool = False, window: int = READ_AHEAD_WINDOW,
                 max_bytes: int = READ_AHEAD_MAX, starts: bool = False, adjacent: bool = False) -> None:
        self.after, self.chained, self.max_bytes = after, chained, max_bytes
        self.starts, self.adjacent = starts, adjacent
        self._recent: deque[tuple[str, Version]] = deque(maxlen=window)  # shards of the last opens
        self._done: set[tuple[str, Version]] = set()
        self._ends: dict[tuple[str, Version], int] = {}  # shard -> where its last opened chunk ends (adjacent)

    def swept(self, ext: Extent) -> bool:
        """True if ``note`` found a sweep of ``ext``'s shard (at this version) with at least
        ``WALK_OPENS`` of its chunks among the last opens."""
        shard = (ext.key, ext.version)
        return shard in self._done and self._recent.count(shard) >= WALK_OPENS

    def note(self, ext: Extent, first: bool = False) -> bool:
        shard = (ext.key, ext.version)
        visit = shard not in self._recent
        if visit:  # a new visit: what was read ahead may have been evicted since
            self._done.discard(shard)
        sweeping = (self.chained and len(self._recent) >= self.after and all(
            self._recent[-i] in self._done for i in range(1, self.after + 1))) or (first and self.starts and visit)
        if self.adjacent:
            sweeping = sweeping or self._ends.get(shard) == ext.offset
            if len(self._ends) >= 4096:
                self._ends.clear()
            self._ends[shard] = ext.offset + ext.nbytes
        self._recent.append(shard)
        if ext.version.size > self.max_bytes or shard in self._done:
            return False
        if not sweeping and self._recent.count(shard) < self.after:
            return False
        if len(self._done) >= 4096:
            self._done.clear()
        self._done.add(shard)
        return True


class Reads:
    """Opens and reads chunk files of one source (see the module docstring for the contracts).

    Subclasses provide ``_stored`` (a chunk's stored bytes), and may serve undecoded chunks
    from a descriptor instead (``_stored_handle``, ``_read_stored``, ``release``).
    """

    prefetches = False  # True: a sweep fetches the shards after it ahead (``fetch_whole``), and a
    # scattered read the indexes of its array's shards (``keys_below``)
    index_calls = 32  # worker thread calls a listing reads shard indexes in at once (each index a round trip)
    indexes_per_read = 1  # a never-read index that a lookup or open needs is read with those of the shards
    # after it, this many in all, in one worker thread call (``ShardIndexes.shard_table``)

    def __init__(self, chunk_cache: ChunkCache, ahead: ReadAhead) -> None:
        self.chunk_cache = chunk_cache
        self.ahead = ahead

    async def open(self, ino: int, attr: Attr, ext: Extent, decode: Decode | None, first: bool = False
                   ) -> ReadHandle:
        """A handle on the chunk file stored at ``ext``: its stored bytes, or ``decode`` of them;
        ``first``: the chunk is its shard's first (``ReadAhead.note``)."""
        if decode is not None:
            cached = self.chunk_cache.get(ext)
            if cached is not None:
                return ReadHandle(ino, attr, data=cached)
        ahead = self.ahead.note(ext, first)
        if decode is None:
            return await self._stored_handle(ino, attr, ext, ahead)
        data = await blocking(decode, await self._stored(ext, ahead))
        self.chunk_cache.decoded(ext, data)
        return ReadHandle(ino, attr, data=data)

    async def read(self, handle: ReadHandle, offset: int, size: int) -> bytes | bytearray | memoryview:
        """Up to ``size`` bytes at ``offset``: any buffer, possibly a view of one that the next
        read reuses, so copy or reply before awaiting anything else."""
        if handle.data is not None:
            return memoryview(handle.data)[offset: offset + size]
        if handle.buffer is not None:
            if handle.buffer.spilled:
                return await blocking(handle.buffer.read, offset, size)
            return handle.buffer.read(offset, size)
        return await self._read_stored(handle, offset, size)

    def release(self, handle: ReadHandle) -> None:
        """The handle is closed: free what it holds."""

    def rest(self) -> None:
        """The worker is idle: give back what is kept only to serve the next reads faster
        (a local source's shard descriptors without users)."""

    def room_ahead(self, size: int) -> int:
        """How many shards of ``size`` bytes fetched ahead fit in the memory kept for fetched
        ranges (along with as many being read)."""
        return 0

    def kept(self, key: str, version: Version) -> bool:
        """Whether fetching the shard at ``key`` (at ``version``) whole ahead (``fetch_whole``)
        would bring nothing that its known index does not: its bytes are kept, or are not
        fetched ahead at all."""
        return True

    async def keys_below(self, prefix: str, most: int) -> list[str] | None:
        """Every key below ``prefix`` at any depth (relative to it), if there are at most
        ``most`` (a few listing requests), else None: the shards whose indexes are read ahead."""
        raise NotImplementedError

    async def fetch_whole(self, key: str) -> tuple[bytes, Version] | None:
        """One GET of the whole shard at ``key``, kept for the opens of its chunks; its bytes and
        version (``FileNotFoundError`` if there is none). None: better read its index alone
        (its chunks may be cached on disk under an ETag only the index tells)."""
        raise NotImplementedError

    async def _stored(self, ext: Extent, ahead: bool) -> bytes:
        """The stored bytes at ``ext``; ``ahead``: also read the rest of the shard ahead."""
        raise NotImplementedError

    async def _stored_handle(self, ino: int, attr: Attr, ext: Extent, ahead: bool) -> ReadHandle:
        """A handle serving the stored bytes at ``ext`` as they are."""
        return ReadHandle(ino, attr, data=await self._stored(ext, ahead))

    async def _read_stored(self, handle: ReadHandle, offset: int, size: int) -> bytes | bytearray | memoryview:
        """A read of a handle made by ``_stored_handle`` that holds no bytes."""
        raise NotImplementedError
