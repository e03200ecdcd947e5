"""Chunk reads from a local directory: a shard descriptor per open chunk file, ``pread`` at its extent.

A shard is opened inline on the trio thread (answered from the kernel's inode cache in
microseconds, far less than a trip to a worker thread) and checked against the version its
index was read from; its descriptor is shared by the chunk files open on it and kept for the
next ones (``ShardFiles``). Reads of cached pages are made inline too (``CachedReader``); only cold
reads go to a worker thread. A swept shard (``ReadAhead``) is handed to the kernel's read-ahead
(``POSIX_FADV_WILLNEED``), so the next chunks are served without waiting for the disk; not again
within ``ADVISED_S`` of that: each advice is a worker-thread trip, and readers sweeping planes of
chunks side by side come back to a shard again and again (four zarr 2.18 readers of the bench's
``vol``: 16 visits a shard, 768 advices for 48 shards), its pages still there.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from shardfs.reads.chunkcache import ChunkCache
from shardfs.reads import ReadAhead, ReadHandle, Reads
from shardfs.shards.shard import Extent
from shardfs.storage import Version, VersionMismatch
from shardfs.storage.local import LocalStorage
from shardfs.base.threads import blocking

if TYPE_CHECKING:
    from shardfs.base.attrs import Attr

KEPT_MAX = 64  # shard descriptors kept open without users, at most
KEPT_S = 2.0  # seconds a shard descriptor without users is kept open
ADVISED_S = 2.0  # seconds after a shard was read ahead during which it is not read ahead again
ADVISED_MAX = 4096  # shards remembered as read ahead (all forgotten at once beyond)


class LocalReads(Reads):
    """``Reads`` over a ``LocalStorage``."""

    index_calls = 1  # a small shard's index costs less to read than threads running at once cost in GIL handoffs
    indexes_per_read = 8  # a thread hop costs more than reading a small shard's index (see ShardIndexes.shard_table)

    def __init__(self, source: LocalStorage, chunk_cache: ChunkCache) -> None:
        super().__init__(chunk_cache, ReadAhead())
        self.source = source
        self._reader = CachedReader()
        self._files = ShardFiles()
        self._advised: dict[tuple[str, Version], float] = {}  # shard -> when it was last read ahead

    def _open(self, ext: Extent) -> int:
        """A descriptor of the shard holding ``ext`` (given back with ``ShardFiles.give``);
        ``VersionMismatch`` if it was replaced (or removed) since ``ext`` was resolved."""
        fd = self._files.take(ext.key, ext.version)
        if fd is not None:
            return fd
        try:
            fd, version = self.source.open(ext.key)
        except FileNotFoundError:
            raise VersionMismatch(self.source.describe(ext.key)) from None
        if version != ext.version:
            os.close(fd)
            raise VersionMismatch(self.source.describe(ext.key))
        self._files.add(ext.key, version, fd)
        return fd

    async def _opened(self, ext: Extent, ahead: bool) -> int:
        """``_open``, and the kernel's read-ahead of the whole shard when ``ahead``."""
        fd = self._open(ext)
        if ahead and self._advise(ext):
            try:
                await blocking(os.posix_fadvise, fd, 0, ext.version.size, os.POSIX_FADV_WILLNEED)
            except BaseException:
                self._files.give(fd)
                raise
        return fd

    def _advise(self, ext: Extent) -> bool:
        """Whether to read the shard of ``ext`` ahead now: not if it was within ``ADVISED_S``
        (module docstring)."""
        now = time.monotonic()
        shard = (ext.key, ext.version)
        last = self._advised.get(shard)
        if last is not None and now - last < ADVISED_S:
            return False
        if len(self._advised) >= ADVISED_MAX:
            self._advised.clear()
        self._advised[shard] = now
        return True

    async def _stored_handle(self, ino: int, attr: Attr, ext: Extent, ahead: bool) -> ReadHandle:
        return ReadHandle(ino, attr, fd=await self._opened(ext, ahead), offset=ext.offset, nbytes=ext.nbytes)

    async def _stored(self, ext: Extent, ahead: bool) -> bytes:
        fd = await self._opened(ext, ahead)
        try:
            return await blocking(self._pread, fd, ext.nbytes, ext.offset)
        finally:
            self._files.give(fd)

    async def _read_stored(self, handle: ReadHandle, offset: int, size: int) -> bytes | memoryview:
        size = max(0, min(size, handle.nbytes - offset))
        if size == 0:
            return b""
        data = self._reader.pread(handle.fd, size, handle.offset + offset)
        if data is None:
            return await blocking(self._pread, handle.fd, size, handle.offset + offset)
        self.source.stats.count("READ", None, size)  # from the page cache: not timed
        return data

    def _pread(self, fd: int, size: int, offset: int) -> bytes:
        """``os.pread``, counted as a timed shard read (blocking)."""
        with self.source.stats.request("READ") as timed:
            data = os.pread(fd, size, offset)
            timed.bytes_in = len(data)
        return data

    def release(self, handle: ReadHandle) -> None:
        if handle.fd >= 0:
            self._files.give(handle.fd)
            handle.fd = -1

    def rest(self) -> None:
        self._files.close_unused()


class ShardFiles:
    """Descriptors of shard files, shared by the chunk files open on them and kept open after
    the last of those closes, for ``idle`` shards at most (the least recently used go first)
    and for ``KEPT_S`` after their last use: a client sweeping a shard opens its chunks one
    after another, and each would open the shard again. A descriptor is handed out again only
    for the same key and version, after an ``fstat`` finds its file still at that version (a
    file changed in place is opened anew). A kept descriptor holds its file's blocks after the
    source deleted or replaced it: the time bound, and ``close_unused`` when the worker goes
    idle, keep that short.

    Every descriptor from ``take`` or ``add`` is given back once with ``give``."""

    def __init__(self, idle: int = KEPT_MAX, kept_s: float = KEPT_S) -> None:
        self.idle, self.kept_s = idle, kept_s
        self._kept: dict[tuple[str, Version], int] = {}  # (key, version) -> the descriptor kept for it
        self._shard: dict[int, tuple[str, Version]] = {}  # descriptor -> its (key, version)
        self._users: dict[int, int] = {}  # descriptor -> uses not given back
        self._unused: OrderedDict[int, float] = OrderedDict()  # kept, without users -> since when; oldest first

    def take(self, key: str, version: Version) -> int | None:
        """The descriptor kept for ``key`` at ``version``, or None."""
        fd = self._kept.get((key, version))
        if fd is None:
            return None
        st = os.fstat(fd)
        if (st.st_ino, st.st_size, st.st_mtime_ns) != version:  # changed in place: not handed out again
            del self._kept[(key, version)]
            if fd in self._unused:
                self._close(fd)
            return None
        self._users[fd] += 1
        self._unused.pop(fd, None)
        return fd

    def add(self, key: str, version: Version, fd: int) -> None:
        """``fd``, just opened on ``key`` at ``version``, is in use (once); it is kept."""
        old = self._kept.get((key, version))
        if old is not None and old in self._unused:
            self._close(old)
        self._kept[(key, version)] = fd
        self._shard[fd] = (key, version)
        self._users[fd] = 1

    def give(self, fd: int, now: float | None = None) -> None:
        """One use of ``fd`` ended (at ``now``, ``time.monotonic()`` by default). Unused, it
        stays open if it is still the one kept for its shard, else it is closed; then the
        least recently used beyond ``idle``, and those unused for ``kept_s``, are closed."""
        self._users[fd] -= 1
        if self._users[fd]:
            return
        if self._kept.get(self._shard[fd]) != fd:
            self._close(fd)
            return
        now = time.monotonic() if now is None else now
        self._unused[fd] = now
        while self._unused:
            oldest, since = next(iter(self._unused.items()))
            if len(self._unused) <= self.idle and now - since < self.kept_s:
                break
            self._drop(oldest)

    def close_unused(self) -> None:
        """Close every kept descriptor without users (the worker is idle)."""
        for fd in list(self._unused):
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        """Close unused kept descriptor ``fd``."""
        del self._kept[self._shard[fd]]
        self._close(fd)

    def _close(self, fd: int) -> None:
        self._unused.pop(fd, None)
        del self._shard[fd], self._users[fd]
        os.close(fd)


class CachedReader:
    """``pread`` that never waits for the disk, into one reused buffer.

    A read served from the page cache costs microseconds, far less than a trip
    to a worker thread, so only cold reads are sent off the trio thread. The
    result is a view of a buffer that the next call overwrites: pyfuse3 copies a
    read handler's result into its reply before any other handler runs, so the
    view must be returned to it without an ``await`` in between. Not allocating
    (and zero-filling) a fresh buffer per request is what lets large files stream.
    """

    def __init__(self, capacity: int = 1 << 20) -> None:
        self._buf = memoryview(bytearray(capacity))

    def pread(self, fd: int, size: int, offset: int) -> memoryview | None:
        """``size`` bytes at ``offset`` if all of them are in the page cache, else None."""
        buf = self._buf[:size] if size <= len(self._buf) else memoryview(bytearray(size))
        try:
            n = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
        except (BlockingIOError, OSError):
            return None
        return buf if n == size else None
