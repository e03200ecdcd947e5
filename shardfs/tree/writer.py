"""Mutating operations on the tree: files opened for writing, staging files, rename/link/unlink.

Commit points are ``flush`` (close) of a written chunk file, ``rename`` or
``link`` of a staging file onto a chunk key, and ``unlink`` of a chunk: each is a
``Commits.commit`` (``shardfs.tree.commits``: validated, handed to the ``Writeback``, the
kernel's caches of the inodes it changed invalidated). Errors are
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

from shardfs.base.attrs import Attr, fail
from shardfs.tree.chunks import Chunks
from shardfs.tree.commits import Commits, on_buffer
from shardfs.tree.made import Made
from shardfs.tree.names import Names
from shardfs.tree.nodes import ArrayNode, ChunkKey, DirKey, GroupNode, MetaKey, Staging, StagingKey
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.opens import Opens
from shardfs.tree.structure import Structure
from shardfs.writes.spill import SPILL_THRESHOLD, SpillBuffer
from shardfs.writes.writeback import Writeback

log = logging.getLogger("shardfs")
CREATES = (".zarray", ".zgroup")  # metadata files that make a new directory an array / a group


def node_meta(node: ArrayNode | GroupNode) -> tuple[str, ...]:
    """The metadata files a node may have (shown or unlinked)."""
    return (".zgroup", ".zattrs", ".zmetadata") if isinstance(node, GroupNode) else (".zarray", ".zattrs")


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


class Writer:
    """Applies writes to the arrays of one mount's tree (``names``, ``opens``) through its
    ``commits`` and ``structure``."""

    def __init__(self, names: Names, opens: Opens, nodes: NodeTable, made: Made, chunks: Chunks,
                 writeback: Writeback, commits: Commits, structure: Structure, spill_dir: str,
                 spill_threshold: int = SPILL_THRESHOLD) -> None:
        self.names = names
        self.opens = opens
        self.nodes = nodes
        self.made = made
        self.chunks = chunks
        self.writeback = writeback
        self.commits = commits
        self.invalidate = commits.invalidate
        self.structure = structure
        self.spill_dir = spill_dir
        self.spill_threshold = spill_threshold

    def _buffer(self, data: bytes = b"") -> SpillBuffer:
        return SpillBuffer(self.spill_dir, self.spill_threshold, data)

    # ----- opening ------------------------------------------------------------------------

    async def create(self, parent: int, name: str) -> tuple[Attr, WriteHandle]:
        """Create ``name`` in ``parent``: a new chunk if it is a chunk key, a metadata file of
        the directory's node if it was unlinked, else a staging file."""
        dir_key, node = await self.names.dir_node(parent)
        if node is None and not self.structure.is_new_dir(parent):
            raise fail(errno.ENOENT)
        if isinstance(dir_key, DirKey) and node is not None and name in node_meta(node):
            # a metadata file unlinked before (rm, then cp): applied on close like a rewrite
            ino = self.nodes.inode(MetaKey(node.path, name))
            return self.names.file_attr(ino, 0, self.names.mount_ns), \
                WriteHandle(ino, buf=self._buffer(), dirty=True, meta=(node.path, name))
        target = await self.names.chunk_at_name(parent, name)
        if target is not None:
            self.made.chunk_created(target[0].path, target[1])
            ino = self.nodes.chunk_ino(*target)
            handle = WriteHandle(ino, chunk=target, buf=self._buffer(), dirty=True)
            return self.names.chunk_attr(target[0], ino, 0, self.names.mount_ns), handle
        if isinstance(node, ArrayNode) and node.info is None:
            raise fail(errno.EPERM, "array is not presentable")
        st = self.nodes.new_staging(parent, name, self._buffer())
        return await self.names.getattr(st.ino), WriteHandle(st.ino, staging=st)

    async def open(self, ino: int, truncate: bool) -> WriteHandle:
        """Open an existing chunk, metadata or staging file for writing (``truncate``: O_TRUNC)."""
        key = self.nodes.node_key(ino)
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
            rh = await self.opens.open(handle.ino)
            try:
                handle.buf = self._buffer(bytes(await self.opens.read(rh, 0, 1 << 62)))
            finally:
                self.opens.release(rh)
        return handle.data()

    def release(self, handle: WriteHandle) -> None:
        """The last descriptor of ``handle`` closed: a chunk file's buffer (spill file) goes."""
        if handle.buf is not None:
            handle.buf.clear()

    def dirty_attr(self, handle: WriteHandle) -> Attr | None:
        """What ``stat`` shows of a chunk or metadata file with writes not yet committed through
        ``handle``: the size written so far, modified now; None for a handle without such
        writes or for a staging file (``Names.getattr`` answers for those)."""
        if not handle.dirty:
            return None
        if handle.chunk is not None:
            return self.names.chunk_attr(handle.chunk[0], handle.ino, handle.data().size, time.time_ns())
        if handle.meta is not None:
            return self.names.file_attr(handle.ino, handle.data().size, time.time_ns())
        return None

    # ----- data ---------------------------------------------------------------------------

    def _bound(self, handle: WriteHandle, size: int, what: str) -> None:
        """EFBIG if chunk file ``handle`` would grow past the largest valid inner chunk."""
        if handle.chunk is not None:
            self.commits.check_chunk_size(*handle.chunk, size, what)

    async def read(self, handle: WriteHandle, offset: int, size: int) -> bytes:
        buf = await self._load(handle)
        return await on_buffer(buf, 0, buf.read, offset, size)

    async def write(self, handle: WriteHandle, offset: int, data: bytes) -> int:
        self._bound(handle, offset + len(data), "write")
        buf = await self._load(handle)
        await on_buffer(buf, offset + len(data), buf.write, offset, data)
        handle.dirty = True
        return len(data)

    async def truncate(self, handle: WriteHandle, size: int) -> None:
        self._bound(handle, size, "truncate")
        buf = await self._load(handle)
        await on_buffer(buf, size, buf.truncate, size)
        handle.dirty = True

    async def truncate_closed(self, ino: int, size: int) -> None:
        """``truncate(2)`` by path of a file no handle is writing: a staging file is resized;
        a chunk file past its bound is EFBIG, to any other size EPERM (rewrite it instead)."""
        key = self.nodes.node_key(ino)
        if isinstance(key, StagingKey):
            await on_buffer(key.staging.data, size, key.staging.data.truncate, size)
            return
        if isinstance(key, ChunkKey):
            self.commits.check_chunk_size(key.arr, key.coords, size, "truncate")
        if (await self.names.getattr(ino)).size != size:
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
            data = await on_buffer(buf, 0, buf.getvalue)
            try:
                await self.commits.commit(*handle.chunk, data)
            except OSError:
                await self.invalidate([handle.ino])
                raise
        elif handle.meta is not None:
            handle.dirty = False
            node = await self.names.node(handle.meta[0])
            if node is None:
                raise fail(errno.ENOENT)
            data = await self.commits.metadata_bytes(handle.data(), handle.meta[1])
            await self.structure.commit_metadata(node, handle.meta[1], data)
        else:
            st = handle.staging
            assert st is not None  # a handle writes a chunk, a metadata or a staging file
            if st.name in CREATES and self.nodes.staged.get((st.parent, st.name)) is st \
                    and self.structure.is_new_dir(st.parent):
                handle.dirty = False
                data = await self.commits.metadata_bytes(st.data, st.name)
                await self.structure.create_node(st.parent, st.name, data)
                parent_path = self.nodes.node_key(st.parent).path  # type: ignore[union-attr]  # a directory
                await self.structure.became_meta(st.parent, st.name, parent_path, st.name)

    async def fsync(self, handle: WriteHandle | None) -> None:
        """Commit and make every committed chunk durable (journal fsync)."""
        if handle is not None:
            await self.flush(handle)
        await self.writeback.sync()

    # ----- names --------------------------------------------------------------------------

    async def rename(self, p1: int, n1: str, p2: int, n2: str, noreplace: bool) -> None:
        """Rename a staging file: onto a chunk key or metadata file (a commit), or to another name."""
        st = self.nodes.staged.get((p1, n1))
        if st is None and (p1, n1) in self.nodes.lost:  # a temporary whose bytes died with a worker
            raise fail(errno.EIO)
        if st is None:  # an array or group directory (``Structure.move``), or EPERM
            await self.structure.move(p1, n1, p2, n2, noreplace)
            return
        exists = await self.structure.exists(p2, n2)
        if noreplace and exists:
            raise fail(errno.EEXIST)
        target = await self.names.chunk_at_name(p2, n2)
        if target is not None:
            await self.commits.commit(*target, await self.commits.staged_chunk(st, *target))
            self.nodes.drop_staging(p1, n1, committed=ChunkKey(*target))
            return
        dir_key, node = await self.names.dir_node(p2)
        if isinstance(dir_key, DirKey) and node is not None and n2 in node_meta(node):
            await self.structure.commit_metadata(node, n2, await self.commits.metadata_bytes(st.data, n1))
            await self.structure.became_meta(p1, n1, node.path, n2)
            return
        if n2 in CREATES and self.structure.is_new_dir(p2):
            await self.structure.create_node(p2, n2, await self.commits.metadata_bytes(st.data, n1))
            await self.structure.became_meta(p1, n1, dir_key.path, n2)
            return
        if exists and (p2, n2) not in self.nodes.staged:
            log.error("rename of %s onto %s: not a chunk key or temporary file", n1, n2)
            raise fail(errno.EPERM)
        if (p2, n2) in self.nodes.staged:  # the temporary it replaces is gone, its space too
            self.nodes.drop_staging(p2, n2, committed=None)
        self.nodes.rename_staging(p1, n1, p2, n2)

    async def link(self, ino: int, parent: int, name: str) -> Attr:
        """Hard-link a staging file onto a chunk key: an exclusive create of that chunk."""
        key = self.nodes.node_key(ino)
        target = await self.names.chunk_at_name(parent, name)
        if not isinstance(key, StagingKey) or target is None:
            log.error("link to %s: only a temporary file can be linked onto a chunk key", name)
            raise fail(errno.EPERM)
        if await self.structure.exists(parent, name):
            raise fail(errno.EEXIST)
        await self.commits.commit(*target, await self.commits.staged_chunk(key.staging, *target))
        return await self.names.lookup(parent, name)

    async def unlink(self, parent: int, name: str) -> None:
        """Remove a staging file, empty an inner chunk (``rm`` of a chunk file), or unlink a
        metadata file: it is no longer shown, so ``rm -r`` can empty the directory, and the
        node is deleted from the source by the ``rmdir`` that follows."""
        if (parent, name) in self.nodes.staged:
            self.nodes.drop_staging(parent, name, committed=None)
            return
        if self.nodes.lost and self.nodes.forget_lost(parent, name):  # its bytes died with a worker
            return
        target = await self.names.chunk_at_name(parent, name)
        if target is None:
            await self.names.lookup(parent, name)  # ENOENT if there is nothing
            dir_key, node = await self.names.dir_node(parent)
            if isinstance(dir_key, DirKey) and node is not None and name in self.names.meta_names(node):
                self.made.hide(node.path, name)
                return
            log.error("unlink of %s: only chunk, metadata and temporary files can be removed", name)
            raise fail(errno.EPERM)
        arr, coords = target
        if await self.chunks.extent(arr, coords) is not None:
            await self.commits.commit(arr, coords, None)
        elif not arr.shown.serve_missing or self.made.is_unfilled(arr.path, coords):
            raise fail(errno.ENOENT)
        if arr.shown.serve_missing:  # (else an empty chunk is not shown anyway)
            self.made.unfill(arr.path, coords)


