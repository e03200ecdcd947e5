"""Names and attributes of the tree the mount shows: name resolution, what ``stat`` shows,
metadata files.

Which inode number shows which node (and staging files) is ``shardfs.tree.nodetable``; what
the kernel holds of these inodes (lookup counts, cached pages) is ``shardfs.kernel.inodes``;
opens and reads of the files named here are ``shardfs.tree.opens``; directory listings
``shardfs.tree.listing``.

Node kinds are the key classes of ``shardfs.tree.nodes`` (group and array directories,
metadata files, shard and key directories, inner shards, chunk files, staging
files). A chunk file's inode is computed from the array's slot and the chunk's
C-order position, so a million chunk files cost no memory.

Every method here runs on the trio thread. ``stat`` of source files is made inline,
because it is answered from the kernel's inode cache in microseconds while a trip to a
worker thread costs far more (and every lookup and getattr needs it). Errors are
``OSError`` with the errno to return.
"""

from __future__ import annotations

import errno
import json
import stat
from typing import Any, Iterable

from shardfs.base.attrs import Attr, fail
from shardfs.base.threads import blocking
from shardfs.format.layout import parse_coord
from shardfs.shards.indexes import ShardIndexes
from shardfs.shards.shard import Extent
from shardfs.storage import UNKNOWN, Storage, Version, Unknown
from shardfs.storage.keys import join, list_entries
from shardfs.tree.chunks import Chunks
from shardfs.tree.hierarchy import Hierarchy, v2
from shardfs.tree.made import Made
from shardfs.tree.nodes import (ARRAY_DIRS, ArrayDirKey, ArrayNode, ChunkKey, DirKey, GroupNode, InnerShardKey,
                                KeyDirKey, MetaKey, ShardDirKey, StagingKey)
from shardfs.tree.nodetable import NodeTable
from shardfs.writes.writeback import Pending

RESOLVED_KEPT = 256  # chunk lookups remembered for the opens that follow them


class Resolved:
    """Chunk lookups remembered for the open that usually follows (``Names`` keeps them,
    ``Opens`` takes them): chunk inode -> (extent, attributes), at most ``RESOLVED_KEPT``."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Extent, Attr]] = {}

    def keep(self, ext: Extent, attr: Attr) -> None:
        if len(self._kept) >= RESOLVED_KEPT:
            self._kept.clear()
        self._kept[attr.ino] = (ext, attr)

    def take(self, ino: int) -> tuple[Extent, Attr] | None:
        return self._kept.pop(ino, None)

    def clear(self) -> None:
        self._kept.clear()


class Names:
    """The names and attributes of the tree over one source (a directory or an object-store
    prefix): its groups and arrays (``hierarchy``), inode numbers (``nodes``), what was made
    through the mount (``made``), stored and pending chunks (``chunks``)."""

    def __init__(self, source: Storage, hierarchy: Hierarchy, nodes: NodeTable, made: Made, indexes: ShardIndexes,
                 chunks: Chunks, resolved: Resolved, read_only: bool = True) -> None:
        self.source = source
        self.hierarchy = hierarchy
        self.arrays = hierarchy.arrays  # (read only here)
        self.nodes = nodes
        self.made = made
        self.indexes = indexes
        self.chunks = chunks
        self.resolved = resolved
        self.mount_ns = hierarchy.mount_ns
        self._file_mode = 0o444 if read_only else 0o644
        self._dir_mode = 0o555 if read_only else 0o755

    # ----- the hierarchy (``Hierarchy``) --------------------------------------------------

    async def version(self, key: str, ask: bool = True) -> Version | None | Unknown:
        """``Hierarchy.version``."""
        return await self.hierarchy.version(key, ask)

    async def node(self, path: str) -> ArrayNode | GroupNode | None:
        """``Hierarchy.node``: the group or array at ``path``."""
        return await self.hierarchy.node(path)

    def array(self, path: str) -> ArrayNode | None:
        return self.hierarchy.array(path)

    # ----- chunk attributes ---------------------------------------------------------------

    def chunk_attrs(self, arr: ArrayNode, inos: Iterable[int], sizes: Iterable[int], mtimes: Iterable[int]
                    ) -> list[Attr]:
        """What ``stat`` shows for chunk files of ``arr``: the one place that decides it.

        A chunk file is a regular file with the mount's file mode (0644; 0444 on a read-only
        mount), its size (never negative) and mtime, and ``st_nlink`` the number of directories
        that list it: the array (its root, or a key directory with ``dimension_separator`` "/")
        and, for a sharded array, its shard directory (with nested sharding, its innermost
        inner shard directory). So 2 for a sharded array and 1 for an unsharded one, whether
        or not the file is open for writing.
        """
        mode, nlink = self._chunk_kind(arr)
        return [Attr(ino, mode, size if size > 0 else 0, mtime, nlink) for ino, size, mtime in zip(inos, sizes, mtimes)]

    def _chunk_kind(self, arr: ArrayNode) -> tuple[int, int]:
        """``(st_mode, st_nlink)`` of the chunk files of ``arr`` (see ``chunk_attrs``)."""
        return stat.S_IFREG | self._file_mode, 1 if arr.shown.layout.index is None else 2

    def file_attr(self, ino: int, size: int, mtime_ns: int) -> Attr:
        """What ``stat`` shows for a metadata or staging file: a regular file with the mount's
        file mode, listed in one directory."""
        return Attr(ino, stat.S_IFREG | self._file_mode, size, mtime_ns)

    def chunk_attr(self, arr: ArrayNode, ino: int, size: int, mtime_ns: int) -> Attr:
        """``chunk_attrs`` of one chunk file (every lookup asks: without the lists)."""
        mode, nlink = self._chunk_kind(arr)
        return Attr(ino, mode, size if size > 0 else 0, mtime_ns, nlink)

    def stored_chunk_attr(self, arr: ArrayNode, coords: tuple[int, ...], where: Extent | Pending) -> Attr:
        """The attributes of a stored or pending inner chunk's file."""
        if isinstance(where, Pending):
            stored, mtime_ns = len(where.data or b""), where.mtime_ns  # ``extent`` gives pending chunks with data
        else:
            stored, mtime_ns = where.nbytes, where.version.mtime_ns
        return self.chunk_attr(arr, self.nodes.chunk_ino(arr, coords), int(arr.shown.chunk.file_size(stored)), mtime_ns)

    # ----- name resolution ----------------------------------------------------------------

    async def lookup(self, parent: int, name: str) -> Attr:
        """The attributes of entry ``name`` of directory ``parent``; ENOENT if none."""
        key = self.nodes.node_key(parent)
        if self.nodes.staged and (parent, name) in self.nodes.staged:
            return await self.getattr(self.nodes.staged[(parent, name)].ino)
        if self.nodes.lost and (parent, name) in self.nodes.lost:  # a temporary whose bytes died with a worker
            return self.file_attr(self.nodes.lost[(parent, name)], 0, self.mount_ns)
        if isinstance(key, DirKey):
            node = await self.node(key.path)
            if node is None or isinstance(node, GroupNode):  # (an array's entries are no paths of their own)
                child = join(key.path, name)
                if self.made.is_new_dir(child):
                    return await self.getattr(self.nodes.inode(DirKey(child)))
                if node is None:
                    raise fail(errno.ENOENT)
            if name[:1] == "." and name in self.meta_names(node):  # every metadata file's name starts with "."
                return await self.getattr(self.nodes.inode(MetaKey(node.path, name)))
            if isinstance(node, GroupNode):
                if not name.startswith(".") and await self.node(child) is not None:
                    return await self.getattr(self.nodes.inode(DirKey(child)))
                raise fail(errno.ENOENT)
            if node.info is None:
                raise fail(errno.ENOENT)
            arr = node
        elif isinstance(key, ARRAY_DIRS):
            arr = self.arrays[key.path]
        else:
            raise fail(errno.ENOTDIR)
        coords = self._chunk_named(arr, key, name)
        if coords is not None:
            return await self.chunk_entry(arr, coords)
        return await self._lookup_dir(arr, key, name)

    @staticmethod
    def box_of(arr: ArrayNode, key: DirKey | ArrayDirKey) -> tuple[int, tuple[int, ...]] | None:
        """``(level, box)`` if ``key`` is a shard directory (level 0) or an inner shard (level >= 1)."""
        if isinstance(key, InnerShardKey):
            return key.level, key.box
        shard = arr.shown.layout.keys.parse(key.rel) if isinstance(key, ShardDirKey) else None
        return None if shard is None else (0, shard)

    def _chunk_named(self, arr: ArrayNode, key: DirKey | ArrayDirKey, name: str) -> tuple[int, ...] | None:
        """The inner chunk whose file is entry ``name`` of directory ``key`` of array ``arr``, if
        ``name`` spells one (in the grid or not, stored or not): the one place that says which
        directories hold which chunk names."""
        layout = arr.shown.layout
        box = self.box_of(arr, key)
        if box is not None:  # a shard or inner shard directory: the innermost level holds chunks
            coords = layout.names.parse(name) if box[0] == layout.depth else None
            return coords if coords is not None and layout.box(coords, box[0]) == box[1] else None
        if isinstance(key, ShardDirKey):  # a key prefix directory of the source
            return None
        if layout.keys.view_separator == "/":  # the root and key directories: one level per coordinate
            i = parse_coord(name)
            prefix = key.prefix if isinstance(key, KeyDirKey) else ()
            return prefix + (i,) if i is not None and len(prefix) + 1 == layout.ndim else None
        return layout.names.parse(name)

    async def _lookup_dir(self, arr: ArrayNode, key: DirKey | ArrayDirKey, name: str) -> Attr:
        """Entry ``name`` of directory ``key`` of array ``arr`` that is not a chunk file: a key
        directory, a shard or key prefix directory of the source, or an inner shard."""
        layout = arr.shown.layout
        box = self.box_of(arr, key)
        if box is not None:
            level, outer = box
            coords = layout.names.parse(name) if level < layout.depth else None
            if coords is None or layout.box(layout.box_origin(coords, level + 1), level) != outer:
                raise fail(errno.ENOENT)
            return await self._box_attr(arr, level + 1, coords)
        if layout.keys.view_separator == "/" and not isinstance(key, ShardDirKey):
            i = parse_coord(name)
            prefix = key.prefix if isinstance(key, KeyDirKey) else ()
            if i is not None and len(prefix) + 1 < layout.ndim and i < layout.chunk_grid[len(prefix)] \
                    and (arr.shown.serve_missing or self.made.key_dir_shown(arr.path, prefix + (i,))):
                # (an array whose every chunk is served lists every key directory: they resolve)
                return await self.getattr(self.nodes.inode(KeyDirKey(arr.path, prefix + (i,))))
        rel = key.rel if isinstance(key, ShardDirKey) else "" if isinstance(key, DirKey) else None
        if rel is not None and layout.index is not None:
            sub = self._source_name(arr, name)
            sub = None if sub is None else join(rel, sub)
            if sub is not None and (layout.keys.is_prefix(sub) or layout.keys.parse(sub) is not None):
                return await self.getattr(self.nodes.inode(ShardDirKey(arr.path, sub)))
        raise fail(errno.ENOENT)

    def _source_name(self, arr: ArrayNode, name: str) -> str | None:
        """Source entry name for view entry ``name`` (1-D v2 keys carry a ``.shard`` suffix)."""
        if not self.shard_suffix(arr):
            return name
        return name[: -len(".shard")] if name.endswith(".shard") else None

    @staticmethod
    def shard_suffix(arr: ArrayNode) -> bool:
        keys = arr.shown.layout.keys
        return keys.kind == "v2" and keys.ndim <= 1

    async def chunk_entry(self, arr: ArrayNode, coords: tuple[int, ...]) -> Attr:
        """The attributes of chunk file ``coords`` of ``arr``: stored, pending, or an empty chunk
        served as the fill chunk (unless unlinked through the mount: ``Made.unfill``); ENOENT
        otherwise. A stored one's extent is kept (``resolved``)
        for the open that usually follows."""
        ext = await self.chunks.extent(arr, coords)
        if ext is not None:
            attr = self.stored_chunk_attr(arr, coords, ext)
            if isinstance(ext, Extent):  # for the open that usually follows
                self.resolved.keep(ext, attr)
            return attr
        if not (arr.shown.serve_missing and arr.shown.layout.in_grid(coords)) \
                or self.made.is_unfilled(arr.path, coords):
            raise fail(errno.ENOENT)
        # an empty chunk served as the fill chunk, unchanged since the array's metadata was
        size = len(await self.fill_file(arr))
        return self.chunk_attr(arr, self.nodes.chunk_ino(arr, coords), size, arr.version.mtime_ns)

    async def fill_file(self, arr: ArrayNode) -> bytes:
        """The chunk file of an empty inner chunk of ``arr`` (encoded once per array)."""
        if arr.fill_file is None:
            arr.fill_file = await blocking(arr.shown.fill_file)
        return arr.fill_file

    # ----- shard and inner shard directories --------------------------------------------------

    async def _box_attr(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> Attr:
        """An inner shard directory exists while it holds chunks; its mtime is their newest."""
        chunks = await self.chunks.box_chunks(arr, level, box)
        if not len(chunks.mtime):
            raise fail(errno.ENOENT)
        return self.dir_attr(self.nodes.inode(InnerShardKey(arr.path, level, box)), int(chunks.mtime.max()))

    def meta_names(self, node: ArrayNode | GroupNode) -> tuple[str, ...]:
        """The metadata files shown in a node's directory (not those unlinked through the mount)."""
        if isinstance(node, GroupNode):
            names: tuple[str, ...] = (".zgroup", ".zattrs", ".zmetadata")
        else:
            names = (".zarray", ".zattrs") if node.info is not None else ()
        return self.made.shown(node.path, names)

    async def meta_bytes(self, node: ArrayNode | GroupNode, name: str) -> bytes:
        """Content of a v2 metadata file; ``.zmetadata`` is consolidated on demand."""
        if name == ".zmetadata":
            found: dict[str, Any] = {}
            await self._consolidate(node, "", found)
            return v2().to_json({"zarr_consolidated_format": 1, "metadata": found})
        if isinstance(node, GroupNode):
            return node.zgroup if name == ".zgroup" else node.zattrs
        return node.shown.zarray if name == ".zarray" else node.shown.zattrs

    async def meta_file(self, ino: int, key: MetaKey) -> tuple[Attr, bytes]:
        """The attributes and content of a metadata file, built once (``.zmetadata`` walks the
        hierarchy below its group); ENOENT if the node has no such file."""
        node = await self.node(key.path)
        if node is None or key.name not in self.meta_names(node):
            raise fail(errno.ENOENT)
        data = await self.meta_bytes(node, key.name)
        return self.file_attr(ino, len(data), node.meta_mtime_ns), data

    async def _consolidate(self, node: ArrayNode | GroupNode, prefix: str, out: dict[str, Any]) -> None:
        for name in self.meta_names(node):
            if name != ".zmetadata":
                out[prefix + name] = json.loads(await self.meta_bytes(node, name))
        if isinstance(node, GroupNode):
            for name, is_dir in sorted(await blocking(list_entries, self.source, node.path)):
                child = await self.node(join(node.path, name)) if is_dir and not name.startswith(".") else None
                if child is not None:
                    await self._consolidate(child, f"{prefix}{name}/", out)

    # ----- attributes ---------------------------------------------------------------------

    async def getattr(self, ino: int) -> Attr:
        if self.nodes.is_lost(ino):  # a temporary whose bytes died with a worker: a name to remove (EIO to use)
            return self.file_attr(ino, 0, self.mount_ns)
        key = self.nodes.node_key(ino)
        if isinstance(key, ChunkKey):
            return await self.chunk_entry(key.arr, key.coords)
        if isinstance(key, StagingKey):
            st = key.staging
            return self.file_attr(ino, st.data.size, st.mtime_ns)
        if isinstance(key, DirKey):
            node = await self.node(key.path)
            if node is None:
                if self.made.is_new_dir(key.path):
                    return self.dir_attr(ino, self.mount_ns)
                raise fail(errno.ENOENT)
            return self.dir_attr(ino, node.version.mtime_ns)
        if isinstance(key, MetaKey):
            return (await self.meta_file(ino, key))[0]
        arr = self.arrays[key.path]
        if isinstance(key, ShardDirKey):
            src = join(arr.path, key.rel)
            shard = arr.shown.layout.keys.parse(key.rel)
            if shard is not None:
                version = await self.version(src, ask=False)
                if version is UNKNOWN:  # only a request would tell: read it with the index (needed next)
                    try:
                        found = await self.indexes.shard_table(arr, shard)
                        version = None if found is None else found[0]
                    except OSError:  # corrupt (logged once): the version that read remembered
                        version = await self.version(src)
                if isinstance(version, Version):  # (asked: not UNKNOWN)
                    return self.dir_attr(ino, version.mtime_ns)
                if key.rel in self.chunks.pending_shard_keys(arr) or self.made.shard_dir_made(arr.path, key.rel):
                    return self.dir_attr(ino, self.mount_ns)
                raise fail(errno.ENOENT)
            if (not await blocking(self.source.is_dir, src) and not self.made.shard_dir_made(arr.path, key.rel)
                    and not any(k.startswith(key.rel + "/") for k in self.chunks.pending_shard_keys(arr))):
                raise fail(errno.ENOENT)
            return self.dir_attr(ino, arr.version.mtime_ns)
        if isinstance(key, InnerShardKey):
            return await self._box_attr(arr, key.level, key.box)
        return self.dir_attr(ino, arr.version.mtime_ns)  # KeyDirKey

    def dir_attr(self, ino: int, mtime_ns: int) -> Attr:
        return Attr(ino, stat.S_IFDIR | self._dir_mode, 0, mtime_ns, 2)

    async def chunk_at_name(self, parent: int, name: str) -> tuple[ArrayNode, tuple[int, ...]] | None:
        """The inner chunk that entry ``name`` of directory ``parent`` names, if any (stored or not)."""
        key = self.nodes.node_key(parent)
        if isinstance(key, DirKey):
            await self.node(key.path)
        return self.loaded_chunk_at_name(parent, name)

    def loaded_chunk_at_name(self, parent: int, name: str) -> tuple[ArrayNode, tuple[int, ...]] | None:
        """``chunk_at_name`` of an array read already (no I/O: None for one not read yet)."""
        key = self.nodes.node_key(parent)
        arr = self.arrays.get(key.path) if isinstance(key, (DirKey, *ARRAY_DIRS)) else None
        if arr is None or arr.info is None:
            return None
        coords = self._chunk_named(arr, key, name)  # type: ignore[arg-type]  # a DirKey or ArrayDirKey (checked)
        return (arr, coords) if coords is not None and arr.shown.layout.in_grid(coords) else None

    def names_chunk_inode(self, parent: int, name: str, ino: int) -> bool:
        """True if entry ``name`` of directory ``parent`` names the chunk that chunk inode ``ino``
        shows, in the layout that inode was given in (an earlier one after a resize: the name
        may be outside the grid now); False for any other inode, or one no longer known."""
        try:
            key, chunk = self.nodes.node_key(parent), self.nodes.node_key(ino)
        except OSError:
            return False
        if not isinstance(chunk, ChunkKey) or not isinstance(key, (DirKey, *ARRAY_DIRS)):
            return False
        return key.path == chunk.arr.path and self._chunk_named(chunk.arr, key, name) == chunk.coords

    def moved(self, old: str, new: str) -> None:
        """Directory ``old`` was renamed to ``new`` (``Structure.move``): the hierarchy, the node
        table and what was made through the mount follow it; chunk lookups remembered go."""
        self.hierarchy.moved(old, new)
        self.nodes.moved(old, new)
        self.made.moved(old, new)
        self.resolved.clear()

    async def dir_node(self, ino: int) -> tuple[DirKey | ArrayDirKey, ArrayNode | GroupNode | None]:
        """``(key, node)`` of a directory inode: its key and the group/array it shows or belongs to."""
        key = self.nodes.node_key(ino)
        if isinstance(key, DirKey):
            return key, await self.node(key.path)
        if isinstance(key, ARRAY_DIRS):
            return key, self.arrays[key.path]
        raise fail(errno.ENOTDIR)

    def source_key(self, ino: int) -> str | None:
        """The source file a read of file ``ino`` reads from, whose permissions gate another
        user's open (``shardfs.kernel.callers``): a chunk file's shard (stored or not), a metadata
        file's ``zarr.json``; None for a file being made through the mount."""
        key = self.nodes.node_key(ino)
        if isinstance(key, MetaKey):
            return join(key.path, "zarr.json")
        if isinstance(key, ChunkKey):
            layout = key.arr.shown.layout
            return join(key.arr.path, layout.keys.key(layout.locate(key.coords)[0]))
        return None
