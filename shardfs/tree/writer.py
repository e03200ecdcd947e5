"""Mutating operations on the view: chunk commits, staging files, rename/link/unlink.

Commit points are ``flush`` (close) of a written chunk file, ``rename`` or
``link`` of a staging file onto a chunk key, and ``unlink`` of a chunk. A
commit validates the bytes (exactly one inner chunk with the array's codecs),
hands them to the ``Writeback`` (journal + pending), and invalidates the
kernel's caches of every inode whose content changed. Errors are
``OSError``s raised by the committing call, with one log line naming the file.

Structure (``shardfs.format.create``): ``mkdir`` makes new directories (in memory) and
key directories; a ``.zarray``/``.zgroup`` committed in a new directory creates
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
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np
import trio

from shardfs.shards import shard as shard_mod
from shardfs.format.create import (DEFAULT_SHARD_BYTES, XARRAY_FILL, Refused, array_doc, dimension_names, group_doc,
                                   rewrite_kind)
from shardfs.format.v2 import CorruptChunk
from shardfs.storage import ABSENT, VersionMismatch
from shardfs.format.layout import ArrayLayout, parse_coord
from shardfs.tree.nodes import (ArrayNode, ChunkKey, DirKey, GroupNode, InnerShardKey, KeyDirKey, MetaKey, ShardDirKey,
                                StagingKey)
from shardfs.writes.spill import SPILL_THRESHOLD, SpillBuffer
from shardfs.storage import Unusable
from shardfs.reads.attrs import Attr, fail
from shardfs.tree.nodes import Staging
from shardfs.tree.view import View, blocking, v2
from shardfs.writes.writeback import ShardTarget, Writeback, chunks_in_shard

log = logging.getLogger("shardfs")
Invalidate = Callable[[list[int]], Awaitable[None]]
METADATA_WRITE_MAX = 16 << 20  # a metadata file written or renamed in (EINVAL beyond)
CREATES = (".zarray", ".zgroup")  # metadata files that make a new directory an array / a group


def node_meta(node: ArrayNode | GroupNode) -> tuple[str, ...]:
    """The metadata files a node may have (shown or unlinked)."""
    return (".zgroup", ".zattrs", ".zmetadata") if isinstance(node, GroupNode) else (".zarray", ".zattrs")


def _json(path: str, key: str) -> str:
    return f"{path}/{key}" if path else key


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

    def data(self) -> SpillBuffer:
        return self.staging.data if self.staging is not None else self.buf


async def _run(buf: SpillBuffer, end: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a call on ``buf`` reaching byte ``end``: in a worker thread when it
    touches a spill file (disk I/O), inline when it stays in memory."""
    if buf.spilled or end > buf.threshold:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


class Writer:
    """Applies writes to the view's arrays through the writeback."""

    def __init__(self, view: View, writeback: Writeback, invalidate: Invalidate, spill_dir: str,
                 spill_threshold: int = SPILL_THRESHOLD) -> None:
        self.view = view
        self.writeback = writeback
        self.invalidate = invalidate
        self.spill_dir = spill_dir
        self.spill_threshold = spill_threshold
        self.shard_bytes = DEFAULT_SHARD_BYTES  # -o shard_size: shards of arrays created here
        self._read_versions: dict[str, Any] = {}  # node path -> version of the zarr.json last read

    def _buffer(self, data: bytes = b"") -> SpillBuffer:
        return SpillBuffer(self.spill_dir, self.spill_threshold, data)

    # ----- opening ------------------------------------------------------------------------

    async def create(self, parent: int, name: str) -> tuple[Attr, WriteHandle]:
        """Create ``name`` in ``parent``: a new chunk if it is a chunk key, a metadata file of
        the directory's node if it was unlinked, else a staging file."""
        dir_key, node = await self.view.dir_node(parent)
        if node is None and not self._is_new_dir(parent):
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
        limit = arr.info.chunk.max_file_size
        if size > limit:
            log.error("%s/%s: %s refused: %d bytes is more than any valid chunk (at most %d bytes)",
                      self.view.source.describe(arr.path), arr.info.layout.names.key(coords), what, size, limit)
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
            data = await _run(handle.buf, 0, handle.buf.getvalue)
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
            await self.commit_metadata(node, handle.meta[1], await self._metadata_bytes(handle.buf, handle.meta[1]))
        else:
            st = handle.staging
            if st.name in CREATES and self.view.nodes.staged.get((st.parent, st.name)) is st \
                    and self._is_new_dir(st.parent):
                handle.dirty = False
                await self.create_node(st.parent, st.name, await self._metadata_bytes(st.data, st.name))
                parent_path = self.view.nodes.node_key(st.parent).path  # type: ignore[union-attr]  # a directory
                await self._became_meta(st.parent, st.name, parent_path, st.name)

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
        name = self.view.source.describe(arr.path) + "/" + arr.info.layout.names.key(coords)
        layout = arr.info.layout
        shard, pos = layout.locate(coords)
        try:
            self.view.source.check_write(self.view.shard_key(arr, shard))  # a non-regular file, a way out
        except Unusable as e:
            log.error("%s: write refused: %s", name, e.strerror)
            raise fail(e.errno) from None
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
            # a full disk or quota is the writer's to know (and fix); anything else is EIO
            raise fail(e.errno if e.errno in (errno.ENOSPC, errno.EDQUOT) else errno.EIO) from None
        if data is not None and arr.path in self.view.created:  # its key directories now resolve
            self.view.made_keys.update((arr.path, coords[:k]) for k in range(1, len(coords)))
        await self.invalidate([self.view.nodes.chunk_ino(arr, coords)])

    async def commit_metadata(self, node: ArrayNode | GroupNode, name: str, data: bytes) -> None:
        """Apply a metadata file written over an existing node.

        ``.zattrs`` replaces the v3 attributes (``_ARRAY_DIMENSIONS`` become the
        dimension names); ``.zarray`` may change only the shape (a resize) and
        ``.zgroup`` nothing (EPERM otherwise); ``.zmetadata`` is accepted and not
        stored: the mount serves it computed from the source.
        """
        where = self.view.source.describe(node.path) + "/" + name
        try:
            new = json.loads(data)
        except ValueError as e:
            log.error("%s: write refused: not JSON: %s", where, e)
            raise fail(errno.EINVAL) from None
        if name == ".zarray" and isinstance(node, ArrayNode) and node.info is not None:
            shown = json.loads(node.info.zarray)
            try:
                fills = (shown.get("fill_value"), (await self._doc(node.path)).get("fill_value"))
                change = rewrite_kind(new, shown, fills)
            except Refused as e:
                if (node.path, ".zarray") in self.view.hidden:  # unlinked before: a new array there
                    await self._replace_array(node, data)
                    return
                log.error("%s: write refused: %s", where, e)
                raise fail(errno.EPERM) from None
            if change == "resize":
                await self.resize(node, tuple(new["shape"]))
        elif name == ".zattrs":
            if not isinstance(new, dict):
                log.error("%s: write refused: attributes must be a JSON object", where)
                raise fail(errno.EINVAL)
            doc = await self._doc(node.path)
            if doc.get("node_type") == "array":
                names = dimension_names(new, len(doc.get("shape", ())))
                if names is not None:
                    doc["dimension_names"] = names
                old = doc.get("attributes") or {}
                if XARRAY_FILL in old and XARRAY_FILL not in new:  # shown as the fill_value, not in .zattrs
                    new[XARRAY_FILL] = old[XARRAY_FILL]
            doc["attributes"] = new
            await self._write_doc(node.path, doc)
        elif name == ".zgroup" and new != {"zarr_format": 2}:
            log.error("%s: write refused: a group's .zgroup can only be {\"zarr_format\": 2}", where)
            raise fail(errno.EPERM)
        elif name == ".zmetadata" and not isinstance(new, dict):
            log.error("%s: write refused: not consolidated metadata", where)
            raise fail(errno.EINVAL)
        self.view.hidden.discard((node.path, name))
        ino = self.view.nodes.allocated(MetaKey(node.path, name))
        await self.invalidate([ino] if ino else [])

    async def _replace_array(self, node: ArrayNode, zarray: bytes) -> None:
        """A different ``.zarray`` written where the array's was unlinked (``rm .zarray``, then
        a new one): the old array is deleted and a new one made from it (no attributes)."""
        await self._delete_array(node)
        self.view.hidden = {h for h in self.view.hidden if h[0] != node.path}
        self.view.new_dirs.add(node.path)
        dir_ino = self.view.nodes.inode(DirKey(node.path))
        await self.create_node(dir_ino, ".zarray", zarray)
        await self.invalidate([self.view.nodes.inode(MetaKey(node.path, ".zarray"))])

    async def _doc(self, path: str) -> dict[str, Any]:
        """The node's ``zarr.json``; its version is remembered for ``_write_doc``."""
        data, version = await blocking(self.view.source.read_all, _json(path, "zarr.json"))
        self._read_versions[path] = version
        return json.loads(data)

    async def _write_doc(self, path: str, doc: dict[str, Any], new: bool = False) -> None:
        """Replace the node's ``zarr.json`` only if it is still the version ``_doc`` read (or,
        ``new``, still absent): a change made meanwhile behind the mount is not overwritten
        (EBUSY and one log line)."""
        key = _json(path, "zarr.json")
        expected = ABSENT if new else self._read_versions.pop(path, None)
        try:
            await blocking(self.view.source.replace, key, [json.dumps(doc, indent=2).encode()], expected)
        except VersionMismatch:
            log.error("%s: changed behind the mount meanwhile; not overwritten", self.view.source.describe(key))
            raise fail(errno.EBUSY) from None

    async def resize(self, arr: ArrayNode, shape: tuple[int, ...]) -> None:
        """Give ``arr`` a new shape: inner chunks (stored or pending) outside the new chunk
        grid are emptied first (journalled like any delete; shards left empty are removed),
        then ``zarr.json`` gets the shape."""
        layout = arr.info.layout
        if len(shape) != layout.ndim:
            raise fail(errno.EPERM)
        grid = np.array([math.ceil(s / c) for s, c in zip(shape, layout.chunk_shape)], dtype=np.int64)
        for shard in await self.view.listing.stored_shards(arr):
            chunks = await self.view.listing.shard_chunks(arr, shard)
            for coords in chunks.coords[np.any(chunks.coords >= grid, axis=1)].tolist():
                await self.commit(arr, tuple(coords), None)
        doc = await self._doc(arr.path)
        doc["shape"] = list(shape)
        await self._write_doc(arr.path, doc)
        log.info("%s: resized to %s", self.view.source.describe(arr.path), list(shape))

    async def create_node(self, parent: int, name: str, data: bytes) -> None:
        """A ``.zarray`` or ``.zgroup`` written in a new directory: make the v3 array or group,
        with the attributes of a ``.zattrs`` written there before; then commit the files
        written there before it whose names are chunk keys."""
        path = self.view.nodes.node_key(parent).path  # type: ignore[union-attr]  # a new directory's key
        where = self.view.source.describe(path) + "/" + name
        attrs_file = self.view.nodes.staged.get((parent, ".zattrs"))
        try:
            meta = json.loads(data)
            raw = await self._metadata_bytes(attrs_file.data, ".zattrs") if attrs_file is not None else b""
            attrs = json.loads(raw) if raw else {}
            if not isinstance(attrs, dict):
                raise ValueError(".zattrs is not a JSON object")
        except ValueError as e:
            log.error("%s: write refused: not JSON: %s", where, e)
            raise fail(errno.EINVAL) from None
        try:
            if name == ".zgroup":
                doc = group_doc(meta, attrs)
            else:
                doc = array_doc(meta, attrs, self.shard_bytes)
                shown = json.loads(v2().describe_array(doc, self.view.ome, c_order=self.view.c_order).zarray)
                rewrite_kind(meta, shown, (shown.get("fill_value"), doc.get("fill_value")))
        except (Refused, ValueError) as e:  # Unpresentable is a ValueError
            log.error("%s: cannot create: %s", where, e)
            raise fail(errno.EPERM) from None
        await self._write_doc(path, doc, new=True)
        self.view.new_dirs.discard(path)
        if name == ".zarray":
            self.view.created.add(path)
        if attrs_file is not None:
            await self._became_meta(parent, ".zattrs", path, ".zattrs")
        else:  # shown once written: copy tools create it exclusively (O_EXCL) after .zarray
            self.view.hidden.add((path, ".zattrs"))
        if name == ".zgroup":
            self.view.hidden.add((path, ".zmetadata"))
        log.info("%s: created a v3 %s", self.view.source.describe(path), "group" if name == ".zgroup" else "array")
        dirs = [parent] + (await self._adopt_dirs(path) if name == ".zarray" else [])
        for (p, n), st in sorted(self.view.nodes.staged.items()):
            target = await self.view.chunk_at_name(p, n) if p in dirs else None
            if target is not None:
                await self.commit(*target, await self._staged_chunk(st, *target))
                self.view.nodes.drop_staging(p, n, committed=ChunkKey(*target))
        await self.invalidate(dirs)

    async def _adopt_dirs(self, path: str) -> list[int]:
        """Directories made below a new array before its ``.zarray`` (``cp -r`` copies in
        directory order) become its key directories: nested keys (``0/1`` with "/") or
        shard key directories (``c/0``). Their inodes are kept; returns them."""
        arr = await self.view.node(path)
        if not isinstance(arr, ArrayNode) or arr.info is None:
            return []
        layout, inos = arr.info.layout, []
        for made in sorted(d for d in self.view.new_dirs if d.startswith(path + "/")):
            rel = made[len(path) + 1:]
            coords = tuple(map(parse_coord, rel.split("/")))
            if layout.keys.view_separator == "/" and len(coords) < layout.ndim and None not in coords:
                new: Any = KeyDirKey(path, coords)
                self.view.made_keys.add((path, coords))
            elif layout.index is not None and (layout.keys.is_prefix(rel) or layout.keys.parse(rel) is not None):
                new = ShardDirKey(path, rel)
                self.view.made.add((path, rel))
            else:
                continue
            self.view.new_dirs.discard(made)
            ino = self.view.nodes.rebind(DirKey(made), new)
            if ino is not None:
                inos.append(ino)
        return inos

    async def _became_meta(self, parent: int, name: str, path: str, meta: str) -> None:
        """Staging file ``name`` of ``parent`` was committed as metadata file ``meta`` of node
        ``path``: its inode shows that file now, whose content (served from the v3
        metadata) differs from the bytes written, so the kernel's pages and size go."""
        self.view.nodes.drop_staging(parent, name, committed=MetaKey(path, meta))
        await self.invalidate([self.view.nodes.inode(MetaKey(path, meta))])

    def _is_new_dir(self, ino: int) -> bool:
        key = self.view.nodes.node_key(ino)
        return isinstance(key, DirKey) and key.path in self.view.new_dirs

    # ----- names --------------------------------------------------------------------------

    async def rename(self, p1: int, n1: str, p2: int, n2: str, noreplace: bool) -> None:
        """Rename a staging file: onto a chunk key or metadata file (a commit), or to another name."""
        st = self.view.nodes.staged.get((p1, n1))
        if st is None:
            log.error("rename of %s: only temporary files can be renamed", n1)
            raise fail(errno.EPERM)
        exists = await self._exists(p2, n2)
        if noreplace and exists:
            raise fail(errno.EEXIST)
        target = await self.view.chunk_at_name(p2, n2)
        if target is not None:
            await self.commit(*target, await self._staged_chunk(st, *target))
            self.view.nodes.drop_staging(p1, n1, committed=ChunkKey(*target))
            return
        dir_key, node = await self.view.dir_node(p2)
        if isinstance(dir_key, DirKey) and node is not None and n2 in node_meta(node):
            await self.commit_metadata(node, n2, await self._metadata_bytes(st.data, n1))
            await self._became_meta(p1, n1, node.path, n2)
            return
        if n2 in CREATES and self._is_new_dir(p2):
            await self.create_node(p2, n2, await self._metadata_bytes(st.data, n1))
            await self._became_meta(p1, n1, dir_key.path, n2)
            return
        if exists and (p2, n2) not in self.view.nodes.staged:
            log.error("rename of %s onto %s: not a chunk key or temporary file", n1, n2)
            raise fail(errno.EPERM)
        if (p2, n2) in self.view.nodes.staged:  # the temporary it replaces is gone, its space too
            self.view.nodes.drop_staging(p2, n2, committed=None)
        self.view.nodes.staged[(p2, n2)] = self.view.nodes.staged.pop((p1, n1))
        st.parent, st.name = p2, n2

    async def link(self, ino: int, parent: int, name: str) -> Attr:
        """Hard-link a staging file onto a chunk key: an exclusive create of that chunk."""
        key = self.view.nodes.node_key(ino)
        target = await self.view.chunk_at_name(parent, name)
        if not isinstance(key, StagingKey) or target is None:
            log.error("link to %s: only a temporary file can be linked onto a chunk key", name)
            raise fail(errno.EPERM)
        if await self._exists(parent, name):
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
        target = await self.view.chunk_at_name(parent, name)
        if target is None:
            await self.view.lookup(parent, name)  # ENOENT if there is nothing
            dir_key, node = await self.view.dir_node(parent)
            if isinstance(dir_key, DirKey) and node is not None and name in self.view.meta_names(node):
                self.view.hidden.add((node.path, name))
                return
            log.error("unlink of %s: only chunk, metadata and temporary files can be removed", name)
            raise fail(errno.EPERM)
        if await self.view.extent(*target) is None:
            if target[0].info.serve_missing:
                return  # an empty chunk served as the fill chunk: it stays one
            raise fail(errno.ENOENT)
        await self.commit(*target, None)

    async def rmdir(self, parent: int, name: str) -> int:
        """Remove an empty directory (``rm -r``): an array or group whose files were all
        removed is deleted from the source; ENOTEMPTY while anything is listed. Returns the
        removed directory's inode."""
        attr = await self.view.lookup(parent, name)
        key = self.view.nodes.node_key(attr.ino)
        if not isinstance(key, (DirKey, ShardDirKey, InnerShardKey, KeyDirKey)):
            raise fail(errno.ENOTDIR)
        if await self._lists_anything(attr.ino):
            raise fail(errno.ENOTEMPTY)
        if isinstance(key, ShardDirKey):
            self.view.made.discard((key.path, key.rel))
        if isinstance(key, KeyDirKey):
            self.view.made_keys.discard((key.path, key.prefix))
        if not isinstance(key, DirKey):
            return attr.ino
        path = key.path
        node = await self.view.node(path)
        if isinstance(node, ArrayNode):
            await self._delete_array(node)
        elif isinstance(node, GroupNode):
            if not path:
                raise fail(errno.EBUSY)
            await blocking(_remove_all, self.view.source, [_json(path, "zarr.json")])
            log.info("%s: group deleted", self.view.source.describe(path))
        self.view.new_dirs.discard(path)
        self.view.created.discard(path)
        self.view.hidden = {h for h in self.view.hidden if h[0] != path}
        return attr.ino

    async def _delete_array(self, node: ArrayNode) -> None:
        """Delete an array from the source: its pending chunks, shards and ``zarr.json``."""
        if node.info is None:
            log.error("%s: the array is not shown as v2 (%s); not deleted", self.view.source.describe(node.path),
                      node.error)
            raise fail(errno.EPERM)
        await self.writeback.discard(node.path)
        keys = [self.view.shard_key(node, shard) for shard in await self.view.listing.stored_shards(node)]
        await blocking(_remove_all, self.view.source, keys + [_json(node.path, "zarr.json")])
        log.info("%s: array deleted", self.view.source.describe(node.path))

    async def mkdir(self, parent: int, name: str) -> Attr:
        """Make a directory: in a group (or a directory made here), a new directory that a
        ``.zarray``/``.zgroup`` then makes an array/group; in an array, a key directory
        (``c``, ``c/0``, a shard) that writers create before writing chunks into it."""
        if await self._exists(parent, name):
            raise fail(errno.EEXIST)
        key, node = await self.view.dir_node(parent)
        if isinstance(key, DirKey) and not name.startswith(".") and \
                (isinstance(node, GroupNode) or self._is_new_dir(parent)):
            path = f"{key.path}/{name}" if key.path else name
            self.view.new_dirs.add(path)
            return await self.view.getattr(self.view.nodes.inode(DirKey(path)))
        if isinstance(node, ArrayNode) and node.info is not None and isinstance(key, (DirKey, KeyDirKey)) \
                and node.info.layout.keys.view_separator == "/":
            i = parse_coord(name)
            prefix = None if i is None else (key.prefix if isinstance(key, KeyDirKey) else ()) + (i,)
            if prefix is not None and len(prefix) < node.info.layout.ndim and node.info.layout.in_grid(
                    prefix + (0,) * (node.info.layout.ndim - len(prefix))):
                self.view.made_keys.add((node.path, prefix))
                return await self.view.getattr(self.view.nodes.inode(KeyDirKey(node.path, prefix)))
        if isinstance(node, ArrayNode) and node.info is not None and isinstance(key, (DirKey, ShardDirKey)):
            rel = f"{key.rel}/{name}" if isinstance(key, ShardDirKey) else name
            keys = node.info.layout.keys
            if node.info.layout.index is not None and (keys.is_prefix(rel) or keys.parse(rel) is not None):
                self.view.made.add((node.path, rel))
                return await self.view.getattr(self.view.nodes.inode(ShardDirKey(node.path, rel)))
        log.error("mkdir %s: only groups, arrays and key directories can be made", name)
        raise fail(errno.EPERM)

    async def _lists_anything(self, ino: int) -> bool:
        """True if directory ``ino`` lists something besides fill chunks served for empty
        inner chunks (and key directories holding only those): ``rm -r`` cannot unlink those."""
        for name, attr in await self.view.listing.listdir(ino):
            if (ino, name) in self.view.nodes.staged:
                return True
            target = await self.view.chunk_at_name(ino, name)
            if target is not None and target[0].info.serve_missing and await self.view.extent(*target) is None:
                continue
            if isinstance(self.view.nodes.node_key(attr.ino), KeyDirKey) and not await self._lists_anything(attr.ino):
                continue
            return True
        return False

    async def _exists(self, parent: int, name: str) -> bool:
        try:
            await self.view.lookup(parent, name)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False
            raise
        return True


def _remove_all(source: Any, keys: list[str]) -> None:
    """Delete ``keys`` from the source (their emptied directories go too)."""
    for key in keys:
        source.delete(key)
