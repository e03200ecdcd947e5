"""Commits of chunk files: the bytes a client wrote to a chunk file (closed, renamed or linked
onto its name, or emptied by ``rm``) validated and handed to the ``Writeback``.

A commit validates the bytes (exactly one inner chunk with the array's codecs), refuses a
write into a shard that is no regular file or holds a corrupt inner shard, hands them to
the ``Writeback`` (journal + pending), and invalidates the kernel's caches of every inode
whose content changed. A chunk file never grows past the largest valid encoded inner chunk
(``ChunkFormat.max_file_size``: EFBIG), and a staging file or metadata file larger than any
valid one is refused (EINVAL) before its bytes are read. Errors are ``OSError``s with one log
line naming the file. Used by the ``Writer`` and its ``Structure`` (``shardfs.tree.writer``,
``shardfs.tree.structure``); runs on the trio thread.
"""

from __future__ import annotations

import errno
import logging
from typing import Any, Awaitable, Callable

import trio

from shardfs.base.attrs import fail
from shardfs.format.layout import ArrayLayout
from shardfs.format.v2 import CorruptChunk
from shardfs.shards import shard as shard_mod
from shardfs.shards.indexes import ShardIndexes
from shardfs.storage import Storage, Unusable
from shardfs.tree.hierarchy import Hierarchy
from shardfs.tree.made import Made
from shardfs.tree.nodes import ArrayNode, Staging
from shardfs.tree.nodetable import NodeTable
from shardfs.writes.spill import SpillBuffer
from shardfs.writes.writeback import ShardTarget, Writeback, chunks_in_shard

log = logging.getLogger("shardfs")
METADATA_WRITE_MAX = 16 << 20  # a metadata file written or renamed in (EINVAL beyond)
Invalidate = Callable[[list[int]], Awaitable[None]]


async def on_buffer(buf: SpillBuffer, end: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a call on ``buf`` reaching byte ``end``: in a worker thread when it
    touches a spill file (disk I/O), inline when it stays in memory."""
    if buf.spilled or end > buf.threshold:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


def shard_target(array_path: str, layout: ArrayLayout, shard: tuple[int, ...]) -> ShardTarget:
    """What the writeback needs to rewrite one shard of an array."""
    key = layout.keys.key(shard)
    return ShardTarget(f"{array_path}/{key}" if array_path else key, layout.index,
                       chunks_in_shard(layout.chunk_grid, layout.chunks_per_shard, shard))


class Commits:
    """The chunk commits of one writable mount (see the module's docstring): ``invalidate``
    drops the kernel's caches of the inodes a commit changed."""

    def __init__(self, source: Storage, hierarchy: Hierarchy, nodes: NodeTable, made: Made, indexes: ShardIndexes,
                 writeback: Writeback, invalidate: Invalidate) -> None:
        self.source = source
        self.hierarchy = hierarchy
        self.nodes = nodes
        self.made = made
        self.indexes = indexes
        self.writeback = writeback
        self.invalidate = invalidate

    def check_chunk_size(self, arr: ArrayNode, coords: tuple[int, ...], size: int, what: str) -> None:
        """EFBIG (logged) if a chunk file of ``size`` bytes is larger than any valid chunk."""
        limit = arr.shown.chunk.max_file_size
        if size > limit:
            log.error("%s/%s: %s refused: %d bytes is more than any valid chunk (at most %d bytes)",
                      self.source.describe(arr.path), arr.shown.layout.names.key(coords), what, size, limit)
            raise fail(errno.EFBIG)

    async def folded(self, shard: tuple[str, tuple[int, ...]], positions: list[int], version: object) -> None:
        """After a shard rewrite: its chunk files have a new mtime; drop the kernel's cached attributes."""
        arr = self.hierarchy.array(shard[0])
        if arr is None and await self.hierarchy.bind(shard[0]):  # a dead worker's, not read yet: the kernel
            arr = self.hierarchy.array(shard[0])  # may hold its chunks' attributes
        if arr is None or arr.info is None:
            return
        coords = (arr.info.layout.chunk_at(shard[1], pos) for pos in positions)
        await self.invalidate([self.nodes.chunk_ino(arr, c) for c in coords if c is not None])

    async def commit(self, arr: ArrayNode, coords: tuple[int, ...], data: bytes | None) -> None:
        """Make ``data`` the content of inner chunk ``coords`` (None: empty it)."""
        name = self.source.describe(arr.path) + "/" + arr.shown.layout.names.key(coords)
        layout = arr.shown.layout
        shard, pos = layout.locate(coords)
        try:
            self.source.check_write(self.indexes.shard_key(arr, shard))  # a non-regular file, a way out
        except Unusable as e:
            log.error("%s: write refused: %s", name, e.strerror)
            raise fail(e.errno) from None
        found = await self.indexes.shard_table(arr, shard)  # refuses (EIO) to write into a corrupt shard
        if found is not None and shard_mod.has_corrupt(found[1]):
            log.error("%s: write refused: the shard holds a corrupt inner shard", name)
            raise fail(errno.EIO)
        try:
            await self.writeback.commit((arr.path, shard), shard_target(arr.path, arr.shown.layout, shard), pos,
                                        data, prepare=arr.shown.chunk.prepare)
        except CorruptChunk as e:
            log.error("%s: write refused: %s", name, e)
            raise fail(errno.EINVAL, str(e)) from None
        except OSError as e:
            log.error("%s: cannot journal the write: %s", name, e)
            # a full disk or quota is the writer's to know (and fix); anything else is EIO
            raise fail(e.errno if e.errno in (errno.ENOSPC, errno.EDQUOT) else errno.EIO) from None
        if data is not None:  # in an array created here, its key directories now resolve
            self.made.chunk_written(arr.path, coords)
        await self.invalidate([self.nodes.chunk_ino(arr, coords)])

    async def metadata_bytes(self, buf: SpillBuffer, name: str) -> bytes:
        """The bytes of metadata file ``name`` being written; EINVAL, without reading them,
        if there are more than ``METADATA_WRITE_MAX``."""
        if buf.size > METADATA_WRITE_MAX:
            log.error("%s: write refused: %d bytes is more than metadata may be (%d)",
                      name, buf.size, METADATA_WRITE_MAX)
            raise fail(errno.EINVAL)
        return await on_buffer(buf, 0, buf.getvalue)

    async def staged_chunk(self, st: Staging, arr: ArrayNode, coords: tuple[int, ...]) -> bytes:
        """The bytes of staging file ``st`` to commit onto chunk ``coords``; EINVAL without
        reading them if it is larger than any valid chunk."""
        try:
            self.check_chunk_size(arr, coords, st.data.size, "commit")
        except OSError:
            raise fail(errno.EINVAL) from None
        return await on_buffer(st.data, 0, st.data.getvalue)
