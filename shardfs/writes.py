"""Mutating operations on the view: chunk commits, staging files, rename/link/unlink.

Commit points are ``flush`` (close) of a written chunk file, ``rename`` or
``link`` of a staging file onto a chunk key, and ``unlink`` of a chunk. A
commit validates the bytes (exactly one inner chunk with the array's codecs),
hands them to the ``Writeback`` (journal + pending), and invalidates the
kernel's caches of every inode whose content changed. Errors are
``OSError``s raised by the committing call, with one log line naming the file.
"""

from __future__ import annotations

import errno
import json
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from shardfs import shard as shard_mod
from shardfs.shard import CorruptChunk
from shardfs.layout import ArrayLayout
from shardfs.nodes import ChunkKey, DirKey, InnerShardKey, MetaKey, ShardDirKey, StagingKey
from shardfs.view import ArrayNode, Attr, GroupNode, Staging, View, blocking, chunk_name, fail
from shardfs.writeback import ShardTarget, Writeback, chunks_in_shard

log = logging.getLogger("shardfs")
Invalidate = Callable[[list[int]], Awaitable[None]]


def shard_target(array_path: str, layout: ArrayLayout, shard: tuple[int, ...]) -> ShardTarget:
    """What the writeback needs to rewrite one shard of an array."""
    key = layout.keys.key(shard)
    return ShardTarget(f"{array_path}/{key}" if array_path else key, layout.index,
                       chunks_in_shard(layout.chunk_grid, layout.chunks_per_shard, shard))


@dataclass
class WriteHandle:
    """A file open for writing: a chunk file (buffered until flush) or a staging file."""

    ino: int
    chunk: tuple[ArrayNode, tuple[int, ...]] | None = None
    staging: Staging | None = None
    buf: bytearray | None = None  # chunk content; None until first needed
    dirty: bool = False

    def data(self) -> bytearray:
        return self.staging.data if self.staging is not None else self.buf


class Writer:
    """Applies writes to the view's arrays through the writeback."""

    def __init__(self, view: View, writeback: Writeback, invalidate: Invalidate) -> None:
        self.view = view
        self.writeback = writeback
        self.invalidate = invalidate

    # ----- opening ------------------------------------------------------------------------

    async def create(self, parent: int, name: str) -> tuple[Attr, WriteHandle]:
        """Create ``name`` in ``parent``: a new chunk if it is a chunk key, else a staging file."""
        _, node = await self.view.dir_node(parent)
        if node is None:
            raise fail(errno.ENOENT)
        target = await self.view.chunk_at_name(parent, name)
        if target is not None:
            ino = self.view.chunk_ino(*target)
            handle = WriteHandle(ino, chunk=target, buf=bytearray(), dirty=True)
            return self.view.chunk_attr(target[0], ino, 0, self.view.mount_ns), handle
        if isinstance(node, ArrayNode) and node.info is None:
            raise fail(errno.EPERM, "array is not presentable")
        st = self.view.new_staging(parent, name)
        return await self.view.getattr(st.ino), WriteHandle(st.ino, staging=st)

    async def open(self, ino: int, truncate: bool) -> WriteHandle:
        """Open an existing chunk or staging file for writing (``truncate``: O_TRUNC)."""
        key = self.view.node_key(ino)
        if isinstance(key, StagingKey):
            if truncate:
                key.staging.data.clear()
            return WriteHandle(ino, staging=key.staging)
        if isinstance(key, ChunkKey):
            handle = WriteHandle(ino, chunk=(key.arr, key.coords))
            if truncate:
                handle.buf, handle.dirty = bytearray(), True
            return handle
        if isinstance(key, MetaKey):
            raise fail(errno.EPERM, "metadata files are read-only")
        raise fail(errno.EISDIR)

    async def _load(self, handle: WriteHandle) -> bytearray:
        if handle.staging is None and handle.buf is None:
            rh = await self.view.open(handle.ino)
            try:
                handle.buf = bytearray(await self.view.read(rh, 0, 1 << 62))
            finally:
                self.view.release(rh)
        return handle.data()

    # ----- data ---------------------------------------------------------------------------

    async def read(self, handle: WriteHandle, offset: int, size: int) -> bytes:
        return bytes((await self._load(handle))[offset: offset + size])

    async def write(self, handle: WriteHandle, offset: int, data: bytes) -> int:
        buf = await self._load(handle)
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset: offset + len(data)] = data
        handle.dirty = True
        return len(data)

    async def truncate(self, handle: WriteHandle, size: int) -> None:
        buf = await self._load(handle)
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))
        handle.dirty = True

    async def flush(self, handle: WriteHandle) -> None:
        """Commit a written chunk file (close); errors are returned to close()."""
        if handle.chunk is not None and handle.dirty:
            handle.dirty = False  # a refused write is reported (and logged) once
            await self.commit(*handle.chunk, bytes(handle.buf))

    async def fsync(self, handle: WriteHandle | None) -> None:
        """Commit and make every committed chunk durable (journal fsync)."""
        if handle is not None:
            await self.flush(handle)
        await self.writeback.sync()

    # ----- commits ------------------------------------------------------------------------

    async def folded(self, shard: tuple[str, tuple[int, ...]], positions: list[int], version: object) -> None:
        """After a shard rewrite: its chunk files have a new mtime; drop the kernel's cached attributes."""
        arr = self.view.array(shard[0])
        if arr is None or arr.info is None:
            return
        coords = (arr.info.layout.chunk_at(shard[1], pos) for pos in positions)
        await self.invalidate([self.view.chunk_ino(arr, c) for c in coords if c is not None])

    async def commit(self, arr: ArrayNode, coords: tuple[int, ...], data: bytes | None) -> None:
        """Make ``data`` the content of inner chunk ``coords`` (None: empty it)."""
        name = self.view.source.path(arr.path) + "/" + chunk_name(coords)
        layout = arr.info.layout
        shard, pos = layout.locate(coords)
        found = await self.view.shard_table(arr, shard)  # refuses (EIO) to write into a corrupt shard
        if found is not None and shard_mod.has_corrupt(found[1]):
            log.error("%s: write refused: the shard holds a corrupt inner shard", name)
            raise fail(errno.EIO)
        try:
            await self.writeback.commit((arr.path, shard), shard_target(arr.path, arr.info.layout, shard), pos,
                                        data, prepare=arr.info.chunk.prepare)
        except CorruptChunk as e:
            log.error("%s: write refused: %s", name, e)
            raise fail(errno.EINVAL, str(e)) from None
        except OSError as e:
            log.error("%s: cannot journal the write: %s", name, e)
            raise fail(errno.EIO) from None
        await self.invalidate([self.view.chunk_ino(arr, coords)])

    async def commit_metadata(self, node: ArrayNode | GroupNode, name: str, data: bytes) -> None:
        """Accept a metadata file write: ``.zattrs`` updates the v3 attributes; ``.zarray`` and
        ``.zgroup`` may only be rewritten unchanged (EPERM otherwise)."""
        where = self.view.source.path(node.path) + "/" + name
        try:
            new = json.loads(data)
        except ValueError as e:
            log.error("%s: write refused: not JSON: %s", where, e)
            raise fail(errno.EINVAL) from None
        if name == ".zmetadata":
            log.error("%s: write refused: consolidated metadata is computed from the source", where)
            raise fail(errno.EPERM)
        if name != ".zattrs":
            current = json.loads(await self.view.meta_bytes(node, name))
            if new != current:
                log.error("%s: write refused: changing an array's shape, type or codecs is not supported", where)
                raise fail(errno.EPERM)
            return
        if not isinstance(new, dict):
            log.error("%s: write refused: attributes must be a JSON object", where)
            raise fail(errno.EINVAL)
        key = (node.path + "/" if node.path else "") + "zarr.json"
        doc = json.loads(await blocking(self.view.source.read, key))
        if doc.get("dimension_names") is not None:
            new.pop("_ARRAY_DIMENSIONS", None)
        doc["attributes"] = new
        await blocking(self.view.source.replace, key, [json.dumps(doc, indent=2).encode()])
        ino = self.view.allocated(MetaKey(node.path, name))
        await self.invalidate([ino] if ino else [])

    # ----- names --------------------------------------------------------------------------

    async def rename(self, p1: int, n1: str, p2: int, n2: str, noreplace: bool) -> None:
        """Rename a staging file: onto a chunk key or metadata file (a commit), or to another name."""
        st = self.view.staged.get((p1, n1))
        if st is None:
            log.error("rename of %s: only temporary files can be renamed", n1)
            raise fail(errno.EPERM)
        exists = await self._exists(p2, n2)
        if noreplace and exists:
            raise fail(errno.EEXIST)
        target = await self.view.chunk_at_name(p2, n2)
        if target is not None:
            await self.commit(*target, bytes(st.data))
            self.view.drop_staging(p1, n1, committed=ChunkKey(*target))
            return
        dir_key, node = await self.view.dir_node(p2)
        if isinstance(dir_key, DirKey) and node is not None and n2 in self.view.meta_names(node):
            await self.commit_metadata(node, n2, bytes(st.data))
            self.view.drop_staging(p1, n1, committed=MetaKey(node.path, n2))
            return
        if exists and (p2, n2) not in self.view.staged:
            log.error("rename of %s onto %s: not a chunk key or temporary file", n1, n2)
            raise fail(errno.EPERM)
        self.view.staged.pop((p2, n2), None)
        self.view.staged[(p2, n2)] = self.view.staged.pop((p1, n1))

    async def link(self, ino: int, parent: int, name: str) -> Attr:
        """Hard-link a staging file onto a chunk key: an exclusive create of that chunk."""
        key = self.view.node_key(ino)
        target = await self.view.chunk_at_name(parent, name)
        if not isinstance(key, StagingKey) or target is None:
            log.error("link to %s: only a temporary file can be linked onto a chunk key", name)
            raise fail(errno.EPERM)
        if await self._exists(parent, name):
            raise fail(errno.EEXIST)
        await self.commit(*target, bytes(key.staging.data))
        return await self.view.lookup(parent, name)

    async def unlink(self, parent: int, name: str) -> None:
        """Remove a staging file, or empty an inner chunk (``rm`` of a chunk file)."""
        if (parent, name) in self.view.staged:
            self.view.drop_staging(parent, name, committed=None)
            return
        target = await self.view.chunk_at_name(parent, name)
        if target is None:
            await self.view.lookup(parent, name)  # ENOENT if there is nothing
            log.error("unlink of %s: only chunk files and temporary files can be removed", name)
            raise fail(errno.EPERM)
        if await self.view.extent(*target) is None:
            raise fail(errno.ENOENT)
        await self.commit(*target, None)

    async def rmdir(self, parent: int, name: str) -> None:
        """Remove a shard directory that no longer holds chunks (``rm -r``); EPERM otherwise."""
        attr = await self.view.lookup(parent, name)
        key = self.view.node_key(attr.ino)
        shard_dir = isinstance(key, (ShardDirKey, InnerShardKey))
        if shard_dir and await self.view.listdir(attr.ino):
            raise fail(errno.ENOTEMPTY)
        if not shard_dir:
            log.error("rmdir of %s: groups, arrays and key directories cannot be removed", name)
            raise fail(errno.EPERM)

    async def _exists(self, parent: int, name: str) -> bool:
        try:
            await self.view.lookup(parent, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True
