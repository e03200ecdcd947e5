"""The chunks an array has: those stored in its shards merged with those pending in the
writeback (written through the mount, not folded yet), in one place.

``extent`` says where one inner chunk is (pending bytes, a stored extent, or nothing);
``stored_shards``, ``shard_chunks`` and ``box_chunks`` what a shard (or an inner shard) holds,
column-wise (``ChunkSet``); ``pending_shard_keys`` the shards that exist only as pending
chunks. Indexes are read through the mount's ``ShardIndexes``; object sources tell the
read-ahead (``Prefetch``) of each chunk looked up. Runs on the trio thread.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np

from shardfs.format.index import EMPTY
from shardfs.reads.prefetch import Prefetch
from shardfs.shards import shard as shard_mod
from shardfs.shards.indexes import ShardIndexes
from shardfs.shards.shard import CorruptShard, Extent
from shardfs.storage import Storage, Version
from shardfs.base.attrs import fail
from shardfs.storage.keys import join, list_entries
from shardfs.base.threads import blocking
from shardfs.tree.nodes import ArrayNode
from shardfs.writes.writeback import Pending, Writeback

if TYPE_CHECKING:
    from shardfs.reads import Reads


class ChunkSet(NamedTuple):
    """Stored inner chunks, column-wise: global coordinates ``(n, ndim)``, file sizes, mtimes."""

    coords: np.ndarray
    size: np.ndarray
    mtime: np.ndarray

    def where(self, mask: np.ndarray | slice) -> "ChunkSet":
        return ChunkSet(self.coords[mask], self.size[mask], self.mtime[mask])

    @staticmethod
    def concat(sets: list["ChunkSet"], ndim: int) -> "ChunkSet":
        if not sets:
            return ChunkSet(np.empty((0, ndim), np.int64), np.empty(0, np.int64), np.empty(0, np.int64))
        return ChunkSet(*(np.concatenate(cols) for cols in zip(*sets)))


class Chunks:
    """Stored ∪ pending chunks of the arrays of one mount over ``source``."""

    def __init__(self, source: Storage, writeback: Writeback | None, indexes: ShardIndexes, reads: Reads,
                 prefetch: Prefetch) -> None:
        self.source = source
        self.writeback = writeback
        self.indexes = indexes
        self.reads = reads
        self.prefetch = prefetch

    async def extent(self, arr: ArrayNode, coords: tuple[int, ...]) -> Extent | Pending | None:
        """Where inner chunk ``coords`` is: pending in the writeback, stored in a shard, or
        None if it is empty or outside the grid. Object sources: a cold chunk of the shard
        after a swept one fetches it whole with the shards after it (``Prefetch.walk_on``); another
        cold chunk other than its shard's first starts reading the array's indexes ahead
        (``Prefetch.indexes_ahead``)."""
        layout = arr.shown.layout
        if not layout.in_grid(coords):
            return None
        shard, pos = layout.locate(coords)
        pending = self.writeback.pending((arr.path, shard), pos) if self.writeback else None
        if pending is not None:
            return pending if pending.data is not None else None
        if self.reads.prefetches and self.prefetch.walking(arr):
            self.prefetch.walk_on(arr, shard)
        if pos and not arr.indexes_ahead and self.reads.prefetches:
            self.prefetch.indexes_ahead(arr, shard)
        key = self.indexes.shard_key(arr, shard)
        found = await self.indexes.shard_table(arr, shard, key)
        if found is None:
            return None
        version, table = found
        try:
            return shard_mod.extent(key, version, table, pos)
        except CorruptShard:  # its inner shard; logged when the shard's table was read
            raise fail(errno.EIO) from None

    def unchanged(self, arr: ArrayNode, coords: tuple[int, ...], ext: Extent) -> bool:
        """True if ``extent(arr, coords)`` would still be ``ext`` (found by a lookup): its shard
        is still at that version when asked inline (so its index is the same) and no write is
        pending for the chunk. Cheaper than asking ``extent`` again."""
        try:
            if self.source.version_now(ext.key) != ext.version:
                return False
        except OSError:  # unusable now: ``extent`` says so
            return False
        if self.writeback is None:
            return True
        shard, pos = arr.shown.layout.locate(coords)
        return self.writeback.pending((arr.path, shard), pos) is None

    def pending_shard_keys(self, arr: ArrayNode) -> set[str]:
        """Keys (below the array) of the shards with pending chunks: their directories exist
        before the first fold creates them in the source."""
        if self.writeback is None:
            return set()
        return {arr.shown.layout.keys.key(shard) for shard in self.writeback.dirty_shards(arr.path)
                if any(p.data is not None for p in self.writeback.pending_in((arr.path, shard)).values())}

    async def stored_shards(self, arr: ArrayNode, rel: str = "") -> list[tuple[int, ...]]:
        """Coordinates of the stored shards at or below source directory ``rel`` of the array (and,
        at the array's top, those with pending chunks: taken before the source is listed, so a
        shard folded meanwhile is in one or the other)."""
        keys = arr.shown.layout.keys
        dirty = set(self.writeback.dirty_shards(arr.path)) if not rel and self.writeback is not None else set()
        out = []
        for name, is_dir in await blocking(list_entries, self.source, join(arr.path, rel)):
            sub = join(rel, name)
            if is_dir and keys.is_prefix(sub):
                out.extend(await self.stored_shards(arr, sub))
            elif not is_dir:
                coords = keys.parse(sub)
                if coords is not None and arr.shown.layout.shard_in_grid(coords):
                    out.append(coords)
        return sorted(set(out) | dirty) if dirty else out

    async def shard_chunks(self, arr: ArrayNode, shard: tuple[int, ...]) -> ChunkSet:
        """The stored (or pending) inner chunks of one shard, sorted by index position;
        none if the shard is corrupt."""
        return await self.shards_chunks(arr, [shard])

    async def shards_chunks(self, arr: ArrayNode, shards: list[tuple[int, ...]]) -> ChunkSet:
        """``shard_chunks`` of each of ``shards`` in turn, made column-wise for all of them at
        once (a listing of many small shards costs numpy calls per batch, not per shard). The
        pending chunks are taken before the indexes are read: a chunk folded meanwhile is in one
        or the other (read after, it was in neither: the index read before the fold's rename,
        the pending chunks after its end; zarr 2.18 saw an array it had just written empty)."""
        layout = arr.shown.layout
        pendings = [self.writeback.pending_in((arr.path, shard)) for shard in shards] if self.writeback else []
        found: list[tuple[int, tuple[Version, np.ndarray]]] = []
        for i, shard in enumerate(shards):
            try:
                table = await self.indexes.shard_table(arr, shard)
            except OSError:
                table = None
            if table is not None:
                found.append((i, table))
        if found:
            tables = np.stack([table for _, (_, table) in found])  # (shards, rows, 2)
            which, pos = np.nonzero(tables[:, :, 0] != EMPTY)
            nbytes = tables[which, pos, 1].astype(np.int64)
            mtime = np.array([version.mtime_ns for _, (version, _) in found], dtype=np.int64)[which]
            owner = np.array([i for i, _ in found], dtype=np.int64)[which]
            del tables
        else:
            owner, pos, nbytes, mtime = (np.empty(0, np.int64) for _ in range(4))
        if pendings:
            patched = False
            for i, pending in enumerate(pendings):
                if pending:
                    keep = ~((owner == i) & np.isin(pos, np.fromiter(pending, np.int64, len(pending))))
                    live = sorted((i, p, len(x.data), x.mtime_ns) for p, x in pending.items() if x.data is not None)
                    extra = np.array(live, dtype=np.int64).reshape(-1, 4)
                    owner, pos, nbytes, mtime = (np.concatenate([col[keep], extra[:, j]])
                                                 for j, col in enumerate((owner, pos, nbytes, mtime)))
                    patched = True
            if patched:
                order = np.lexsort((pos, owner))
                owner, pos, nbytes, mtime = owner[order], pos[order], nbytes[order], mtime[order]
        at = np.array(shards, dtype=np.int64).reshape(len(shards), layout.ndim)[owner]
        coords, inside = layout.chunks_at(at, pos)
        return ChunkSet(coords[inside], cast(np.ndarray, arr.shown.chunk.file_size(nbytes[inside])), mtime[inside])

    async def box_chunks(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> ChunkSet:
        """The stored chunks of shard ``box`` (level 0) or of a nested inner shard (level >= 1)."""
        layout = arr.shown.layout
        chunks = await self.shard_chunks(arr, layout.box(layout.box_origin(box, level), 0))
        if level == 0:
            return chunks
        return chunks.where(np.all(chunks.coords // np.array(layout.spans[level]) == np.array(box), axis=1))
