"""Chunk reads from a local directory: a descriptor per open chunk file, ``pread`` at its extent.

A shard is opened inline on the trio thread (answered from the kernel's inode cache in
microseconds, far less than a trip to a worker thread) and checked against the version its
index was read from. Reads of cached pages are made inline too (``CachedReader``); only cold
reads go to a worker thread. A swept shard (``ReadAhead``) is handed to the kernel's read-ahead
(``POSIX_FADV_WILLNEED``), so the next chunks are served without waiting for the disk.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shardfs.chunkcache import ChunkCache
from shardfs.reads import ReadAhead, ReadHandle, Reads
from shardfs.shard import Extent
from shardfs.storage import VersionMismatch
from shardfs.storage.local import LocalStorage
from shardfs.threads import blocking

if TYPE_CHECKING:
    from shardfs.view import Attr


class LocalReads(Reads):
    """``Reads`` over a ``LocalStorage``."""

    def __init__(self, source: LocalStorage, chunk_cache: ChunkCache) -> None:
        super().__init__(chunk_cache, ReadAhead())
        self.source = source
        self._reader = CachedReader()

    def _open(self, ext: Extent) -> int:
        """A descriptor of the shard holding ``ext``; ``VersionMismatch`` if it was replaced
        (or removed) since ``ext`` was resolved."""
        try:
            fd, version = self.source.open(ext.key)
        except FileNotFoundError:
            raise VersionMismatch(self.source.describe(ext.key)) from None
        if version != ext.version:
            os.close(fd)
            raise VersionMismatch(self.source.describe(ext.key))
        return fd

    async def _opened(self, ext: Extent, ahead: bool) -> int:
        """``_open``, and the kernel's read-ahead of the whole shard when ``ahead``."""
        fd = self._open(ext)
        if ahead:
            try:
                await blocking(os.posix_fadvise, fd, 0, ext.version.size, os.POSIX_FADV_WILLNEED)
            except BaseException:
                os.close(fd)
                raise
        return fd

    async def _stored_handle(self, ino: int, attr: Attr, ext: Extent, ahead: bool) -> ReadHandle:
        return ReadHandle(ino, attr, fd=await self._opened(ext, ahead), offset=ext.offset, nbytes=ext.nbytes)

    async def _stored(self, ext: Extent, ahead: bool) -> bytes:
        fd = await self._opened(ext, ahead)
        try:
            return await blocking(os.pread, fd, ext.nbytes, ext.offset)
        finally:
            os.close(fd)

    async def _read_stored(self, handle: ReadHandle, offset: int, size: int) -> bytes | memoryview:
        size = max(0, min(size, handle.nbytes - offset))
        if size == 0:
            return b""
        data = self._reader.pread(handle.fd, size, handle.offset + offset)
        if data is None:
            data = await blocking(os.pread, handle.fd, size, handle.offset + offset)
        return data

    def _stored_now(self, handle: ReadHandle) -> memoryview | None:
        return self._reader.pread(handle.fd, handle.nbytes, handle.offset) if handle.fd >= 0 else None

    def release(self, handle: ReadHandle) -> None:
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1


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
