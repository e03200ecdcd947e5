"""Directory listings (readdirplus) and the stored inner chunks they show.

Contract: ``Listing.listdir`` returns every entry of a directory with the attributes
``stat`` would show for it (``Tree.getattr``, ``Tree.chunk_attrs``): the metadata files,
child groups and arrays, and directories made by mkdir of a group; the chunk files
(and, with dimension_separator "/", key directories) of an array, with the empty chunks
it serves when it has at most ``LIST_FILL_MAX`` of them; the shards and key prefixes of
a source directory; the inner shards or chunks of a (nested) shard directory; then the
staging files of the directory. ``stored_shards`` and ``shard_chunks`` say which shards
and inner chunks are stored or pending (written through the mount, not folded yet).

Everything else it needs comes from the view, seen through the ``Tree`` protocol (this
module does not import ``shardfs.view``). Runs on the trio thread; source listings go
to worker threads.
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import trio

from shardfs.attrs import Attr, fail, join, list_entries
from shardfs.index import EMPTY
from shardfs.nodes import (ARRAY_DIRS, ArrayDirKey, ArrayNode, DirKey, GroupNode, InnerShardKey, KeyDirKey, MetaKey,
                           ShardDirKey)
from shardfs.nodetable import CHUNK_BASE, SLOT_SHIFT, NodeTable
from shardfs.storage import Storage, Version
from shardfs.threads import blocking

if TYPE_CHECKING:
    from shardfs.writeback import Writeback

log = logging.getLogger("shardfs")

INDEX_READS = 32  # shard indexes a listing reads at once
LIST_FILL_MAX = 1 << 22  # arrays with more inner chunks do not list the empty ones they serve


class ChunkSet(NamedTuple):
    """Stored inner chunks, column-wise: global coordinates ``(n, ndim)``, file sizes, mtimes."""

    coords: np.ndarray
    size: np.ndarray
    mtime: np.ndarray

    def where(self, mask: np.ndarray) -> "ChunkSet":
        return ChunkSet(self.coords[mask], self.size[mask], self.mtime[mask])

    @staticmethod
    def concat(sets: list["ChunkSet"], ndim: int) -> "ChunkSet":
        if not sets:
            return ChunkSet(np.empty((0, ndim), np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        return ChunkSet(*(np.concatenate(cols) for cols in zip(*sets)))


class Tree(Protocol):
    """What a listing needs of the view (``shardfs.view.View``)."""

    source: Storage
    writeback: Writeback | None
    nodes: NodeTable
    new_dirs: set[str]
    arrays: dict[str, ArrayNode]

    async def node(self, path: str) -> ArrayNode | GroupNode | None: ...
    def new_children(self, path: str) -> list[str]: ...
    def meta_names(self, node: ArrayNode | GroupNode) -> tuple[str, ...]: ...
    async def meta_bytes(self, node: ArrayNode | GroupNode, name: str) -> bytes: ...
    def file_attr(self, ino: int, size: int, mtime_ns: int) -> Attr: ...
    def chunk_attrs(self, arr: ArrayNode, inos: Any, sizes: Any, mtimes: Any) -> list[Attr]: ...
    def dir_attr(self, ino: int, mtime_ns: int) -> Attr: ...
    async def getattr(self, ino: int) -> Attr: ...
    def box_of(self, arr: ArrayNode, key: DirKey | ArrayDirKey) -> tuple[int, tuple[int, ...]] | None: ...
    async def box_chunks(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> ChunkSet: ...
    def pending_shard_keys(self, arr: ArrayNode) -> set[str]: ...
    def shard_suffix(self, arr: ArrayNode) -> bool: ...
    async def shard_table(self, arr: ArrayNode, shard: tuple[int, ...]) -> tuple[Version, np.ndarray] | None: ...
    async def fill_file(self, arr: ArrayNode) -> bytes: ...


class Listing:
    """The listings of one view's directories (``tree``)."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree

    async def listdir(self, ino: int) -> list[tuple[str, Attr]]:
        """All entries of a directory with their attributes (for readdirplus)."""
        entries = await self._listdir(ino)
        for (parent, name), st in sorted(self.tree.nodes.staged.items()):
            if parent == ino:
                entries.append((name, await self.tree.getattr(st.ino)))
        return entries

    async def _listdir(self, ino: int) -> list[tuple[str, Attr]]:
        key = self.tree.nodes.node_key(ino)
        if isinstance(key, DirKey):
            node = await self.tree.node(key.path)
            if node is None:
                if key.path not in self.tree.new_dirs:
                    raise fail(errno.ENOENT)
                return [(name, await self.tree.getattr(self.tree.nodes.inode(DirKey(join(key.path, name)))))
                        for name in self.tree.new_children(key.path)]
            out = []
            for name in self.tree.meta_names(node):
                mino = self.tree.nodes.inode(MetaKey(node.path, name))
                out.append((name, self.tree.file_attr(mino, len(await self.tree.meta_bytes(node, name)), node.meta_mtime_ns)))
            if isinstance(node, GroupNode):
                for name, is_dir in sorted(await blocking(list_entries, self.tree.source, node.path)):
                    child = join(node.path, name)
                    if is_dir and not name.startswith(".") and await self.tree.node(child) is not None:
                        out.append((name, await self.tree.getattr(self.tree.nodes.inode(DirKey(child)))))
                shown = {name for name, _ in out}
                for name in self.tree.new_children(node.path):
                    if name not in shown:
                        out.append((name, await self.tree.getattr(self.tree.nodes.inode(DirKey(join(node.path, name))))))
                return out
            if node.info is not None:  # chunk files only: shard directories are one lookup away
                out.extend(await self._list_array(node, None, ()))
            return out
        if not isinstance(key, ARRAY_DIRS):
            raise fail(errno.ENOTDIR)
        arr = self.tree.arrays[key.path]
        box = self.tree.box_of(arr, key)
        if box is not None:
            return await self._list_box(arr, *box)
        if isinstance(key, ShardDirKey):  # a key prefix directory of the source
            return await self._list_array(arr, key.rel, None)
        return await self._list_array(arr, None, key.prefix)

    async def _list_array(self, arr: ArrayNode, rel: str | None, prefix: tuple[int, ...] | None
                          ) -> list[tuple[str, Attr]]:
        layout = arr.info.layout
        out: list[tuple[str, Attr]] = []
        if rel is not None and layout.index is not None:
            entries = set(await blocking(list_entries, self.tree.source, join(arr.path, rel)))
            for pending in self.tree.pending_shard_keys(arr):  # shards not folded into the source yet
                if not rel or pending.startswith(rel + "/"):
                    name, sep, _rest = pending[len(rel) + 1 if rel else 0:].partition("/")
                    entries.add((name, bool(sep)))
            for name, is_dir in sorted(entries):
                sub = join(rel, name)
                is_shard = not is_dir and layout.keys.parse(sub) is not None
                if is_shard or (is_dir and layout.keys.is_prefix(sub)):
                    shown = name + ".shard" if is_shard and self.tree.shard_suffix(arr) else name
                    ino = self.tree.nodes.inode(ShardDirKey(arr.path, sub))
                    try:
                        out.append((shown, await self.tree.getattr(ino)))
                    except OSError:
                        pass
        if prefix is None:
            return out
        nested = layout.keys.view_separator == "/"
        shards = await self.stored_shards(arr)
        await self.read_indexes(arr, shards)
        chunks = ChunkSet.concat([await self.shard_chunks(arr, shard) for shard in shards], layout.ndim)
        if arr.info.serve_missing:
            if int(np.prod(layout.chunk_grid, dtype=object)) <= LIST_FILL_MAX:
                chunks = self._with_fill_chunks(arr, chunks, len(await self.tree.fill_file(arr)))
            elif not arr.fill_unlisted:
                arr.fill_unlisted = True
                log.warning("%s: more than %d inner chunks: empty ones are served but not listed",
                            self.tree.source.describe(arr.path), LIST_FILL_MAX)
        if not nested:
            out.extend(zip(layout.names.keys(chunks.coords), self._chunk_attrs(arr, chunks)))
            return out
        depth = len(prefix)
        chunks = chunks.where(np.all(chunks.coords[:, :depth] == np.array(prefix, dtype=np.int64), axis=1))
        if depth + 1 == layout.ndim:
            out.extend(zip(map(str, chunks.coords[:, depth].tolist()), self._chunk_attrs(arr, chunks)))
        else:
            for i in sorted(set(chunks.coords[:, depth].tolist())):
                kino = self.tree.nodes.inode(KeyDirKey(arr.path, prefix + (i,)))
                out.append((str(i), self.tree.dir_attr(kino, arr.version.mtime_ns)))
        return out

    async def _list_box(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> list[tuple[str, Attr]]:
        """A shard or inner shard directory: its inner shards, or at the innermost level its chunks."""
        layout = arr.info.layout
        chunks = await self.tree.box_chunks(arr, level, box)
        if level == layout.depth:
            return list(zip(layout.names.keys(chunks.coords), self._chunk_attrs(arr, chunks)))
        newest: dict[tuple[int, ...], int] = {}
        for c, mtime in zip(map(tuple, (chunks.coords // np.array(layout.spans[level + 1])).tolist()),
                            chunks.mtime.tolist()):
            newest[c] = max(newest.get(c, 0), mtime)
        return [(layout.names.key(child), self.tree.dir_attr(self.tree.nodes.inode(InnerShardKey(arr.path, level + 1, child)), mtime))
                for child, mtime in sorted(newest.items())]

    async def stored_shards(self, arr: ArrayNode, rel: str = "") -> list[tuple[int, ...]]:
        """Coordinates of the stored shards at or below source directory ``rel`` of the array."""
        keys = arr.info.layout.keys
        out = []
        for name, is_dir in await blocking(list_entries, self.tree.source, join(arr.path, rel)):
            sub = join(rel, name)
            if is_dir and keys.is_prefix(sub):
                out.extend(await self.stored_shards(arr, sub))
            elif not is_dir:
                coords = keys.parse(sub)
                if coords is not None and arr.info.layout.shard_in_grid(coords):
                    out.append(coords)
        if not rel and self.tree.writeback is not None:
            out = sorted(set(out) | set(self.tree.writeback.dirty_shards(arr.path)))
        return out

    async def read_indexes(self, arr: ArrayNode, shards: list[tuple[int, ...]], at_once: int = INDEX_READS) -> None:
        """Read the indexes of ``shards`` that are not cached, ``at_once`` at a time (a
        listing needs them all; over an object store each is a round trip). Errors are left
        for the caller's own ``shard_table`` to meet."""
        limiter = trio.CapacityLimiter(at_once)

        async def one(shard: tuple[int, ...]) -> None:
            async with limiter:
                try:
                    await self.tree.shard_table(arr, shard)
                except OSError:
                    pass

        async with trio.open_nursery() as nursery:
            for shard in shards:
                nursery.start_soon(one, shard)

    async def shard_chunks(self, arr: ArrayNode, shard: tuple[int, ...]) -> ChunkSet:
        """The stored (or pending) inner chunks of one shard, sorted by index position;
        none if the shard is corrupt."""
        layout = arr.info.layout
        try:
            found = await self.tree.shard_table(arr, shard)
        except OSError:
            found = None
        if found is None:
            pos, nbytes, mtime = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        else:
            version, table = found
            pos = np.flatnonzero(table[:, 0] != EMPTY)
            nbytes = table[pos, 1].astype(np.int64)
            mtime = np.full(len(pos), version.mtime_ns, dtype=np.int64)
        pending = self.tree.writeback.pending_in((arr.path, shard)) if self.tree.writeback is not None else {}
        if pending:
            keep = ~np.isin(pos, np.fromiter(pending, np.int64, len(pending)))
            live = sorted((p, len(x.data), x.mtime_ns) for p, x in pending.items() if x.data is not None)
            extra = np.array(live, dtype=np.int64).reshape(-1, 3)
            pos, nbytes, mtime = (np.concatenate([col[keep], extra[:, i]]) for i, col in enumerate((pos, nbytes, mtime)))
            order = np.argsort(pos, kind="stable")
            pos, nbytes, mtime = pos[order], nbytes[order], mtime[order]
        coords, inside = layout.chunks_at(shard, pos)
        return ChunkSet(coords[inside], arr.info.chunk.file_size(nbytes[inside]), mtime[inside])

    @staticmethod
    def _with_fill_chunks(arr: ArrayNode, stored: ChunkSet, fill_size: int) -> ChunkSet:
        """Every in-bounds inner chunk in C order: ``stored`` ones as they are, the others as
        fill chunks (``fill_size`` bytes, the array metadata's mtime)."""
        grid = arr.info.layout.chunk_grid
        n = int(np.prod(grid, dtype=np.int64))
        coords = np.indices(grid, dtype=np.int64).reshape(len(grid), n).T
        size = np.full(n, fill_size, dtype=np.int64)
        mtime = np.full(n, arr.version.mtime_ns, dtype=np.int64)
        if len(stored.size):
            at = np.ravel_multi_index(tuple(stored.coords.T), grid) if grid else np.zeros(len(stored.size), np.int64)
            size[at], mtime[at] = stored.size, stored.mtime
        return ChunkSet(coords, size, mtime)

    def _chunk_attrs(self, arr: ArrayNode, chunks: ChunkSet) -> list[Attr]:
        """The attributes of every chunk file of ``chunks`` (``_chunk_attr`` column-wise)."""
        layout = arr.info.layout
        base = CHUNK_BASE + (arr.slot << SLOT_SHIFT)
        linear = np.ravel_multi_index(tuple(chunks.coords.T), layout.chunk_grid) if layout.ndim else \
            np.zeros(len(chunks.size), np.int64)
        return self.tree.chunk_attrs(arr, (linear + base).tolist(), chunks.size.tolist(), chunks.mtime.tolist())
