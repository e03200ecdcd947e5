"""Opens and reads of the files the tree shows: metadata bytes, staging files, and stored,
pending or empty chunks, through the read path of the source's kind (``shardfs.reads``).

Which file an inode is, and its attributes, is ``shardfs.tree.names``'s to say; an open of a
chunk whose lookup just found its extent reuses it (``Resolved``) while its shard's version is
unchanged. Chunk files that serving decodes (checksums, transcoding) are decoded in worker
threads, within ``-o max_chunk`` (``Budget``). Runs on the trio thread; errors are ``OSError``
with the errno to return.
"""

from __future__ import annotations

import errno
import functools
import logging

from shardfs.base.attrs import Attr, fail
from shardfs.base.budget import Budget
from shardfs.base.threads import blocking
from shardfs.config import ReadConfig
from shardfs.format.v2 import CorruptChunk
from shardfs.reads import ReadHandle, Reads
from shardfs.reads.prefetch import Prefetch
from shardfs.shards.indexes import ShardIndexes
from shardfs.shards.shard import Extent
from shardfs.storage import Storage, VersionMismatch
from shardfs.tree.chunks import Chunks
from shardfs.tree.names import Names, Resolved
from shardfs.tree.nodes import ArrayNode, ChunkKey, MetaKey, StagingKey
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.tries import Tries
from shardfs.writes.writeback import Pending

log = logging.getLogger("shardfs")


class Opens:
    """Opens, reads and releases of the files of one mount's tree (``names``), chunk files read
    through ``reads`` (``shardfs.reads.factory.make_reads``)."""

    def __init__(self, source: Storage, names: Names, nodes: NodeTable, chunks: Chunks, indexes: ShardIndexes,
                 reads: Reads, prefetch: Prefetch, resolved: Resolved, max_chunk: int = ReadConfig.max_chunk) -> None:
        """``max_chunk``: the largest inner chunk decoded (``-o max_chunk``; see ``_decode``)."""
        self.source = source
        self.names = names
        self.nodes = nodes
        self.chunks = chunks
        self.indexes = indexes
        self.reads = reads
        self.prefetch = prefetch
        self.resolved = resolved
        self.max_chunk = max_chunk
        self._decoding = Budget(max_chunk)  # chunk bytes being transcoded at once, all threads together
        self._too_large: set[str] = set()  # arrays whose inner chunks were refused (logged once each)

    async def open(self, ino: int, tries: Tries | None = None) -> ReadHandle:
        """Open a file for reading: metadata bytes, a staging file, or a stored, pending or
        empty chunk (``Reads.open``). A shard replaced between its index read and the open is
        looked up again while ``tries`` (``tree.tries``: shared with the kernel adapter's) has
        one left, then EIO (logged)."""
        key = self.nodes.node_key(ino)
        attr: Attr | None
        if isinstance(key, MetaKey):
            attr, data = await self.names.meta_file(ino, key)
            return ReadHandle(ino, attr, data=data)
        if isinstance(key, StagingKey):
            return ReadHandle(ino, await self.names.getattr(ino), buffer=key.staging.data)
        if not isinstance(key, ChunkKey):
            raise fail(errno.EISDIR)
        arr, coords = key.arr, key.coords
        resolved = self.resolved.take(ino)
        ext: Extent | Pending | None = None
        tries = tries or Tries()
        while tries.take():
            if resolved is not None and self.chunks.unchanged(arr, coords, resolved[0]):
                ext, attr = resolved
            else:
                ext = await self.chunks.extent(arr, coords)
                attr = None
            resolved = None
            if ext is None:
                attr = await self.names.chunk_entry(arr, coords)  # ENOENT unless empty chunks are served
                return ReadHandle(ino, attr, data=await self.names.fill_file(arr))
            attr = attr or self.names.stored_chunk_attr(arr, coords, ext)
            if isinstance(ext, Pending):
                return ReadHandle(ino, attr, data=await blocking(self._decode, arr, coords, ext.data))
            decode = functools.partial(self._decode, arr, coords, key=ext.key) if arr.shown.chunk.decodes else None
            if decode is not None:
                self._check_size(arr, coords, ext)
            first = self.reads.prefetches and not any(c % n for c, n in zip(coords, arr.shown.layout.chunks_per_shard))
            try:
                handle = await self.reads.open(ino, attr, ext, decode, first)
            except VersionMismatch:  # replaced since its version was remembered: look again
                self.source.changed(ext.key)
                self.indexes.forget(ext.key)
                continue
            if self.reads.prefetches:
                self.prefetch.note_shard(arr, coords, ext)
            return handle
        assert isinstance(ext, Extent)  # only an open of a stored chunk tries again (and one try is left to it)
        log.error("%s: changed during %d opens of chunk %s", self.source.describe(ext.key), tries.total,
                  arr.shown.layout.names.key(coords))
        raise fail(errno.EIO, "shard keeps changing")

    def _check_size(self, arr: ArrayNode, coords: tuple[int, ...], ext: Extent) -> None:
        """Before a stored inner chunk that serving decodes is read: EIO (logged) if it is longer
        than one inner chunk can be stored (``ChunkFormat.max_stored``: corrupt, and reading it
        would take that much memory), or if decoding it would pass ``max_chunk``."""
        self._check_max_chunk(arr)
        fmt = arr.shown.chunk
        if ext.nbytes > fmt.max_stored:
            log.error("%s: corrupt chunk %s: inner chunk of %d bytes stored, more than one inner chunk "
                      "takes (%d): not read", self.source.describe(ext.key), arr.shown.layout.names.key(coords),
                      ext.nbytes, fmt.max_stored)
            raise fail(errno.EIO, "stored inner chunk too large")

    def _check_max_chunk(self, arr: ArrayNode) -> None:
        """EIO if transcoding a chunk of ``arr`` would make more than ``max_chunk`` bytes (logged
        once per array: its inner chunks are too large to decode within the memory bound)."""
        fmt = arr.shown.chunk
        if fmt.transcoder is not None and fmt.nbytes > self.max_chunk:
            if arr.path not in self._too_large:
                self._too_large.add(arr.path)
                log.error("%s: inner chunks of %d bytes are larger than -o max_chunk=%d: not decoded (EIO)",
                          self.source.describe(arr.path), fmt.nbytes, self.max_chunk)
            raise fail(errno.EIO, "inner chunk too large")

    def _decode(self, arr: ArrayNode, coords: tuple[int, ...], stored: bytes, key: str = "") -> bytes:
        """A chunk file's bytes from its stored form (checksum/transcoding); EIO if corrupt
        (logged), or if it is larger than ``max_chunk`` (``_check_max_chunk``). Transcodes in
        all threads together hold at most ``max_chunk`` chunk bytes at once (``Budget``: a
        decode waits for room). Blocking."""
        self._check_max_chunk(arr)
        fmt = arr.shown.chunk
        try:
            if fmt.transcoder is None:
                return fmt.to_file(stored)
            with self._decoding.hold(fmt.nbytes):
                return fmt.to_file(stored)
        except CorruptChunk as e:
            where = self.source.describe(key or arr.path)
            log.error("%s: corrupt chunk %s: %s", where, arr.shown.layout.names.key(coords), e)
            raise fail(errno.EIO) from None

    async def read(self, handle: ReadHandle, offset: int, size: int) -> bytes | bytearray | memoryview:
        """``Reads.read``: up to ``size`` bytes at ``offset``, possibly a view of a buffer that
        the next read reuses, so copy or reply before awaiting anything else."""
        return await self.reads.read(handle, offset, size)

    def release(self, handle: ReadHandle) -> None:
        self.reads.release(handle)
