"""Mutating operations on the view: chunk commits, staging files, rename/link/unlink.

Commit points are ``flush`` (close) of a written chunk file, ``rename`` or
``link`` of a staging file onto a chunk key, and ``unlink`` of a chunk. A
commit validates the bytes (exactly one inner chunk with the array's codecs),
hands them to the ``Writeback`` (journal + pending), and invalidates the
kernel's caches of every inode whose content changed. Errors are
``OSError``s raised by the committing call, with one log line naming the file.

Structure (``Writer.structure``, ``shardfs.tree.structure``): ``mkdir`` makes new directories
(in memory) and key directories; a ``.zarray``/``.zgroup`` committed in a new directory creates
the v3 node; metadata rewrites update ``zarr.json`` (attributes, a resize);
unlinks of metadata files hide them and ``rmdir`` of an emptied array or group
deletes it from the source.

Contents being written (chunk files, staging files) are ``SpillBuffer``s: at
most ``SPILL_THRESHOLD`` bytes each in memory, the rest in unlinked spill
files. A chunk file never grows past the largest valid encoded inner chunk
(``ChunkFormat.max_file_size``): a write or truncate beyond it fails with
EFBIG, and a staging file larger than that is refused (EINVAL) by the rename
or link that would commit it, before its bytes are read.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import trio

from shardfs.shards import shard as shard_mod
from shardfs.format.create import DEFAULT_SHARD_BYTES
from shardfs.format.v2 import CorruptChunk
from shardfs.format.layout import ArrayLayout
from shardfs.tree.nodes import ArrayNode, ChunkKey, DirKey, GroupNode, MetaKey, Staging, StagingKey
from shardfs.writes.spill import SPILL_THRESHOLD, SpillBuffer
from shardfs.storage import Unusable
from shardfs.base.attrs import Attr, fail
from shardfs.tree.structure import Invalidate, Structure
from shardfs.tree.view import View
from shardfs.writes.writeback import ShardTarget, Writeback, chunks_in_shard

log = logging.getLogger("shardfs")
METADATA_WRITE_MAX = 16 << 20  # a metadata file written or renamed in (EINVAL beyond)
CREATES = (".zarray", ".zgroup")  # metadata files that make a new directory an array / a group


def node_meta(node: ArrayNode | GroupNode) -> tuple[str, ...]:
    """The metadata files a node may have (shown or unlinked)."""
    return (".zgroup", ".zattrs", ".zmetadata") if isinstance(node, GroupNode) else (".zarray", ".zattrs")


def shard_target(array_path: str, layout: ArrayLayout, shard: tuple[int, ...]) -> ShardTarget:
    """What the writeback needs to rewrite one shard of an array."""
    key = layout.keys.key(shard)
    return ShardTarget(f"{array_path}/{key}" if array_path else key, layout.index,
                       chunks_in_shard(layout.chunk_grid, layout.chunks_per_shard, shard))


@dataclass
class WriteHandle:
    """A file open for writing: a chunk or metadata file (buffered until flush) or a staging file."""

    ino: int
    chunk: tuple[ArrayNode, tuple[int, ...]] | None = None
    staging: Staging | None = None
    buf: SpillBuffer | None = None  # chunk or metadata content; None until first needed
    meta: tuple[str, str] | None = None  # (node path, metadata file name)
    dirty: bool = False
    committed: bool = False  # its staging file was renamed onto a chunk or metadata file (``Handles.committed``)

    def data(self) -> SpillBuffer:
        """The content: the staging file's, else the buffer (loaded by ``Writer._load`` or made by a
        truncating open: every write, and ``dirty``, come after one of them)."""
        if self.staging is not None:
            return self.staging.data
        if self.buf is None:
            raise RuntimeError(f"inode {self.ino}: written before its content was loaded")
        return self.buf


async def _run(buf: SpillBuffer, end: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a call on ``buf`` reaching byte ``end``: in a worker thread when it
    touches a spill file (disk I/O), inline when it stays in memory."""
    if buf.spilled or end > buf.threshold:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


class Writer:
    """Applies writes to the view's arrays through the writeback."""

    def __init__(self, view: View, writeback: Writeback, invalidate: Invalidate, spill_dir: str,
                 spill_threshold: int = SPILL_THRESHOLD, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.view = view
        self.writeback = writeback
        self.invalidate = invalidate
        self.spill_dir = spill_dir
        self.spill_threshold = spill_threshold
        self.structure = Structure(view, writeback, invalidate, self.commit, self._staged_chunk, self._metadata_bytes,
                                   shard_bytes)

    def _buffer(self, data: bytes = b"") -> SpillBuffer:
        return SpillBuffer(self.spill_dir, self.spill_threshold, data)

    # ----- opening ------------------------------------------------------------------------

    async def create(self, parent: int, name: str) -> tuple[Attr, WriteHandle]:
        """Create ``name`` in ``parent``: a new chunk if it is a chunk key, a metadata file of
        the directory's node if it was unlinked, else a staging file."""
        dir_key, node = await self.view.dir_node(parent)
        if node is None and not self.structure.is_new_dir(parent):
            raise fail(errno.ENOENT)
        if isinstance(dir_key, DirKey) and node is not None and name in node_meta(node):
            # a metadata file unlinked before (rm, then cp): applied on close like a rewrite
            ino = self.view.nodes.inode(MetaKey(node.path, name))
            return self.view.file_attr(ino, 0, self.view.mount_ns), \
                WriteHandle(ino, buf=self._buffer(), dirty=True, meta=(node.path, name))
        target = await self.view.chunk_at_name(parent, name)
        if target is not None:
            ino = self.view.nodes.chunk_ino(*target)
            handle = WriteHandle(ino, chunk=target, buf=self._buffer(), dirty=True)
            return self.view.chunk_attr(target[0], ino, 0, self.view.mount_ns), handle
        if isinstance(node, ArrayNode) and node.info is None:
            raise fail(errno.EPERM, "array is not presentable")
        st = self.view.nodes.new_staging(parent, name, self._buffer())
        return await self.view.getattr(st.ino), WriteHandle(st.ino, staging=st)

    async def open(self, ino: int, truncate: bool) -> WriteHandle:
        """Open an existing chunk, metadata or staging file for writing (``truncate``: O_TRUNC)."""
        key = self.view.nodes.node_key(ino)
        if isinstance(key, StagingKey):
            if truncate:
                key.staging.data.clear()
            return WriteHandle(ino, staging=key.staging)
        if isinstance(key, (ChunkKey, MetaKey)):
            handle = (WriteHandle(ino, chunk=(key.arr, key.coords)) if isinstance(key, ChunkKey)
                      else WriteHandle(ino, meta=(key.path, key.name)))
            if truncate:
                handle.buf, handle.dirty = self._buffer(), True
            return handle
        raise fail(errno.EISDIR)

    async def _load(self, handle: WriteHandle) -> SpillBuffer:
        if handle.staging is None and handle.buf is None:
            rh = await self.view.open(handle.ino)
            try:
                handle.buf = self._buffer(bytes(await self.view.read(rh, 0, 1 << 62)))
            finally:
                self.view.release(rh)
        return handle.data()

    def release(self, handle: WriteHandle) -> None:
        """The last descriptor of ``handle`` closed: a chunk file's buffer (spill file) goes."""
        if handle.buf is not None:
            handle.buf.clear()

    def dirty_attr(self, handle: WriteHandle) -> Attr | None:
        """What ``stat`` shows of a chunk or metadata file with writes not yet committed through
        ``handle``: the size written so far, modified now; None for a handle without such
        writes or for a staging file (the view's ``getattr`` answers for those)."""
        if not handle.dirty:
            return None
        if handle.chunk is not None:
            return self.view.chunk_attr(handle.chunk[0], handle.ino, handle.data().size, time.time_ns())
        if handle.meta is not None:
            return self.view.file_attr(handle.ino, handle.data().size, time.time_ns())
        return None

    # ----- data ---------------------------------------------------------------------------

    def _bound(self, handle: WriteHandle, size: int, what: str) -> None:
        """EFBIG if chunk file ``handle`` would grow past the largest valid inner chunk."""
        if handle.chunk is not None:
            self.check_chunk_size(*handle.chunk, size, what)

    def check_chunk_size(self, arr: ArrayNode, coords: tuple[int, ...], size: int, what: str) -> None:
        limit = arr.shown.chunk.max_file_size
        if size > limit:
            log.error("%s/%s: %s refused: %d bytes is more than any valid chunk (at most %d bytes)",
                      self.view.source.describe(arr.path), arr.shown.layout.names.key(coords), what, size, limit)
            raise fail(errno.EFBIG)

    async def read(self, handle: WriteHandle, offset: int, size: int) -> bytes:
        buf = await self._load(handle)
        return await _run(buf, 0, buf.read, offset, size)

    async def write(self, handle: WriteHandle, offset: int, data: bytes) -> int:
        self._bound(handle, offset + len(data), "write")
        buf = await self._load(handle)
        await _run(buf, offset + len(data), buf.write, offset, data)
        handle.dirty = True
        return len(data)

    async def truncate(self, handle: WriteHandle, size: int) -> None:
        self._bound(handle, size, "truncate")
        buf = await self._load(handle)
        await _run(buf, size, buf.truncate, size)
        handle.dirty = True

    async def truncate_closed(self, ino: int, size: int) -> None:
        """``truncate(2)`` by path of a file no handle is writing: a staging file is resized;
        a chunk file past its bound is EFBIG, to any other size EPERM (rewrite it instead)."""
        key = self.view.nodes.node_key(ino)
        if isinstance(key, StagingKey):
            await _run(key.staging.data, size, key.staging.data.truncate, size)
            return
        if isinstance(key, ChunkKey):
            self.check_chunk_size(key.arr, key.coords, size, "truncate")
        if (await self.view.getattr(ino)).size != size:
            log.error("truncate of inode %d: only temporary files and chunk files open for writing can be "
                      "resized", ino)
            raise fail(errno.EPERM)

    async def flush(self, handle: WriteHandle) -> None:
        """Commit a written chunk or metadata file, or a ``.zarray``/``.zgroup`` written in a
        new directory (close); errors are returned to close(). A refused chunk commit drops
        the kernel's cached size and pages of the file, so ``stat`` shows the previous
        content's size at once."""
        if not handle.dirty:
            return
        if handle.chunk is not None:
            handle.dirty = False  # a refused write is reported (and logged) once
            buf = handle.data()
            data = await _run(buf, 0, buf.getvalue)
            try:
                await self.commit(*handle.chunk, data)
            except OSError:
                await self.invalidate([handle.ino])
                raise
        elif handle.meta is not None:
            handle.dirty = False
            node = await self.view.node(handle.meta[0])
            if node is None:
                raise fail(errno.ENOENT)
            data = await self._metadata_bytes(handle.data(), handle.meta[1])
            await self.structure.commit_metadata(node, handle.meta[1], data)
        else:
            st = handle.staging
            assert st is not None  # a handle writes a chunk, a metadata or a staging file
            if st.name in CREATES and self.view.nodes.staged.get((st.parent, st.name)) is st \
                    and self.structure.is_new_dir(st.parent):
                handle.dirty = False
                await self.structure.create_node(st.parent, st.name, await self._metadata_bytes(st.data, st.name))
                parent_path = self.view.nodes.node_key(st.parent).path  # type: ignore[union-attr]  # a directory
                await self.structure.became_meta(st.parent, st.name, parent_path, st.name)

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
        await self.invalidate([self.view.nodes.chunk_ino(arr, c) for c in coords if c is not None])

    async def commit(self, arr: ArrayNode, coords: tuple[int, ...], data: bytes | None) -> None:
        """Make ``data`` the content of inner chunk ``coords`` (None: empty it)."""
        name = self.view.source.describe(arr.path) + "/" + arr.shown.layout.names.key(coords)
        layout = arr.shown.layout
        shard, pos = layout.locate(coords)
        try:
            self.view.source.check_write(self.view.indexes.shard_key(arr, shard))  # a non-regular file, a way out
        except Unusable as e:
            log.error("%s: write refused: %s", name, e.strerror)
            raise fail(e.errno) from None
        found = await self.view.indexes.shard_table(arr, shard)  # refuses (EIO) to write into a corrupt shard
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
            self.view.made.chunk_written(arr.path, coords)
        await self.invalidate([self.view.nodes.chunk_ino(arr, coords)])


    # ----- names --------------------------------------------------------------------------

    async def rename(self, p1: int, n1: str, p2: int, n2: str, noreplace: bool) -> None:
        """Rename a staging file: onto a chunk key or metadata file (a commit), or to another name."""
        st = self.view.nodes.staged.get((p1, n1))
        if st is None and (p1, n1) in self.view.nodes.lost:  # a temporary whose bytes died with a worker
            raise fail(errno.EIO)
        if st is None:  # an array or group directory (``Structure.move``), or EPERM
            await self.structure.move(p1, n1, p2, n2, noreplace)
            return
        exists = await self.structure.exists(p2, n2)
        if noreplace and exists:
            raise fail(errno.EEXIST)
        target = await self.view.chunk_at_name(p2, n2)
        if target is not None:
            await self.commit(*target, await self._staged_chunk(st, *target))
            self.view.nodes.drop_staging(p1, n1, committed=ChunkKey(*target))
            return
        dir_key, node = await self.view.dir_node(p2)
        if isinstance(dir_key, DirKey) and node is not None and n2 in node_meta(node):
            await self.structure.commit_metadata(node, n2, await self._metadata_bytes(st.data, n1))
            await self.structure.became_meta(p1, n1, node.path, n2)
            return
        if n2 in CREATES and self.structure.is_new_dir(p2):
            await self.structure.create_node(p2, n2, await self._metadata_bytes(st.data, n1))
            await self.structure.became_meta(p1, n1, dir_key.path, n2)
            return
        if exists and (p2, n2) not in self.view.nodes.staged:
            log.error("rename of %s onto %s: not a chunk key or temporary file", n1, n2)
            raise fail(errno.EPERM)
        if (p2, n2) in self.view.nodes.staged:  # the temporary it replaces is gone, its space too
            self.view.nodes.drop_staging(p2, n2, committed=None)
        self.view.nodes.rename_staging(p1, n1, p2, n2)

    async def link(self, ino: int, parent: int, name: str) -> Attr:
        """Hard-link a staging file onto a chunk key: an exclusive create of that chunk."""
        key = self.view.nodes.node_key(ino)
        target = await self.view.chunk_at_name(parent, name)
        if not isinstance(key, StagingKey) or target is None:
            log.error("link to %s: only a temporary file can be linked onto a chunk key", name)
            raise fail(errno.EPERM)
        if await self.structure.exists(parent, name):
            raise fail(errno.EEXIST)
        await self.commit(*target, await self._staged_chunk(key.staging, *target))
        return await self.view.lookup(parent, name)

    async def _metadata_bytes(self, buf: SpillBuffer, name: str) -> bytes:
        """The bytes of metadata file ``name`` being written; EINVAL, without reading them,
        if there are more than ``METADATA_WRITE_MAX``."""
        if buf.size > METADATA_WRITE_MAX:
            log.error("%s: write refused: %d bytes is more than metadata may be (%d)",
                      name, buf.size, METADATA_WRITE_MAX)
            raise fail(errno.EINVAL)
        return await _run(buf, 0, buf.getvalue)

    async def _staged_chunk(self, st: Staging, arr: ArrayNode, coords: tuple[int, ...]) -> bytes:
        """The bytes of staging file ``st`` to commit onto chunk ``coords``; EINVAL without
        reading them if it is larger than any valid chunk."""
        try:
            self.check_chunk_size(arr, coords, st.data.size, "commit")
        except OSError:
            raise fail(errno.EINVAL) from None
        return await _run(st.data, 0, st.data.getvalue)

    async def unlink(self, parent: int, name: str) -> None:
        """Remove a staging file, empty an inner chunk (``rm`` of a chunk file), or unlink a
        metadata file: it is no longer shown, so ``rm -r`` can empty the directory, and the
        node is deleted from the source by the ``rmdir`` that follows."""
        if (parent, name) in self.view.nodes.staged:
            self.view.nodes.drop_staging(parent, name, committed=None)
            return
        if self.view.nodes.lost and self.view.nodes.forget_lost(parent, name):  # its bytes died with a worker
            return
        target = await self.view.chunk_at_name(parent, name)
        if target is None:
            await self.view.lookup(parent, name)  # ENOENT if there is nothing
            dir_key, node = await self.view.dir_node(parent)
            if isinstance(dir_key, DirKey) and node is not None and name in self.view.meta_names(node):
                self.view.made.hide(node.path, name)
                return
            log.error("unlink of %s: only chunk, metadata and temporary files can be removed", name)
            raise fail(errno.EPERM)
        if await self.view.chunks.extent(*target) is None:
            if target[0].shown.serve_missing:
                return  # an empty chunk served as the fill chunk: it stays one
            raise fail(errno.ENOENT)
        await self.commit(*target, None)


