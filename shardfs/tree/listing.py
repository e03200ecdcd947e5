"""Directory listings (readdirplus), a page at a time.

Contract: ``Listing.pages`` produces every entry of a directory with the attributes
``stat`` would show for it (``Names.getattr``, ``Names.chunk_attrs``): the metadata files,
child groups and arrays, and directories made by mkdir of a group; the chunk files
(and, with dimension_separator "/", key directories) of an array, with the empty chunks
it serves when it has at most ``LIST_FILL_MAX`` of them; the shards and key prefixes of
a source directory; the inner shards or chunks of a (nested) shard directory; then the
staging files of the directory. Which shards and inner chunks are stored or pending
(written through the mount, not folded yet) is ``shardfs.tree.chunks.Chunks``'s to say.

Memory: entries are made a page (at most ``PAGE``) at a time, as a reader consumes them
(``DirStream``: one per open directory, keeping its offsets stable). An array's chunk files
come at most a page of chunks at a time from their cached indexes (read ``INDEX_BATCH``
shards ahead, many to a worker thread call, ``Reads.index_calls`` calls at once; the next
batch's while the reader takes this one's), so listing an array holds its shard coordinates
and at most a page of chunks (at least one shard's), never every chunk file's name and
attributes at once; when it serves
empty inner chunks it also holds the stored chunks' positions, sizes and mtimes (24 bytes
each), never the whole grid. Listings with a key directory per coordinate
(``dimension_separator`` "/") are computed whole, then produced a page at a time.

Names and attributes come from ``shardfs.tree.names`` (``Names``), which never calls back
into a listing. Runs on the trio thread; source listings go to worker threads.
"""

from __future__ import annotations

import errno
import logging
from typing import AsyncGenerator, AsyncIterator, Iterator

import numpy as np
import trio

from shardfs.base.attrs import Attr, fail
from shardfs.storage.keys import join, list_entries
from shardfs.tree.nodes import (ARRAY_DIRS, ArrayNode, DirKey, GroupNode, InnerShardKey, KeyDirKey,
                                MetaKey, ShardDirKey)
from shardfs.shards.indexes import ShardIndexes
from shardfs.tree.chunks import ChunkSet, Chunks
from shardfs.tree.made import Made
from shardfs.tree.names import Names
from shardfs.tree.nodetable import CHUNK_BASE, SLOT_SHIFT, NodeTable
from shardfs.storage import Entry, Storage
from shardfs.base.threads import blocking

log = logging.getLogger("shardfs")

INDEX_BATCH = 256  # shards whose indexes a listing reads ahead of the entries it produces
PAGE = 1024  # entries a listing makes at a time
Entries = list[tuple[str, Attr]]
LIST_FILL_MAX = 1 << 22  # arrays with more inner chunks do not list the empty ones they serve


class Listing:
    """The listings of one mount's directories, their entries named and their attributes made
    by ``names``, their shards' indexes read through ``indexes`` (``index_calls`` worker-thread
    calls at once: ``Reads.index_calls``)."""

    def __init__(self, names: Names, source: Storage, nodes: NodeTable, made: Made, indexes: ShardIndexes,
                 chunks: Chunks, index_calls: int) -> None:
        self.names = names
        self.source = source
        self.nodes = nodes
        self.made = made
        self.arrays = names.arrays
        self.indexes = indexes
        self.chunks = chunks
        self.index_calls = index_calls

    async def listdir(self, ino: int) -> Entries:
        """All entries of a directory with their attributes (every page of ``pages``)."""
        return [entry async for page in self.pages(ino) for entry in page]

    async def pages(self, ino: int) -> AsyncGenerator[Entries, None]:
        """The entries of a directory with their attributes (for readdirplus), in pages of 1 to
        ``PAGE`` entries, each made when the previous one was consumed (errors, e.g. ENOENT,
        come with the first page). A group's children, a shard directory's entries and the
        staging files are each made in one go (a group has few; a shard has at most its
        chunks-per-shard)."""
        async for made in self._pages(ino):
            for at in range(0, len(made), PAGE):
                yield made[at:at + PAGE]
        staged = [(name, await self.names.getattr(st.ino))
                  for (parent, name), st in sorted(self.nodes.staged.items()) if parent == ino]
        for at in range(0, len(staged), PAGE):
            yield staged[at:at + PAGE]

    async def _pages(self, ino: int) -> AsyncIterator[Entries]:
        key = self.nodes.node_key(ino)
        if isinstance(key, DirKey):
            node = await self.names.node(key.path)
            if node is None:
                if not self.made.is_new_dir(key.path):
                    raise fail(errno.ENOENT)
                yield [(name, await self.names.getattr(self.nodes.inode(DirKey(join(key.path, name)))))
                       for name in self.made.new_children(key.path)]
                return
            out = []
            for name in self.names.meta_names(node):
                mino = self.nodes.inode(MetaKey(node.path, name))
                size = len(await self.names.meta_bytes(node, name))
                out.append((name, self.names.file_attr(mino, size, node.meta_mtime_ns)))
            if isinstance(node, GroupNode):
                for name, is_dir in sorted(await blocking(list_entries, self.source, node.path)):
                    child = join(node.path, name)
                    if is_dir and not name.startswith(".") and await self.names.node(child) is not None:
                        out.append((name, await self.names.getattr(self.nodes.inode(DirKey(child)))))
                shown = {name for name, _ in out}
                for name in self.made.new_children(node.path):
                    if name not in shown:
                        ino = self.nodes.inode(DirKey(join(node.path, name)))
                        out.append((name, await self.names.getattr(ino)))
                yield out
                return
            yield out
            if node.info is not None:  # chunk files only: shard directories are one lookup away
                async for page in self._array_pages(node, None, ()):
                    yield page
            return
        if not isinstance(key, ARRAY_DIRS):
            raise fail(errno.ENOTDIR)
        arr = self.arrays[key.path]
        box = self.names.box_of(arr, key)
        if box is not None:  # at most one shard's chunks
            yield await self._list_box(arr, *box)
        elif isinstance(key, ShardDirKey):  # a key prefix directory of the source
            async for page in self._array_pages(arr, key.rel, None):
                yield page
        else:
            assert isinstance(key, KeyDirKey)  # box_of took inner shard directories
            async for page in self._array_pages(arr, None, key.prefix):
                yield page

    async def _array_pages(self, arr: ArrayNode, rel: str | None, prefix: tuple[int, ...] | None
                           ) -> AsyncIterator[Entries]:
        """An array directory: the shards and key prefixes of source directory ``rel``, or the
        chunk files (or key directories) below key ``prefix``."""
        layout = arr.shown.layout
        if rel is not None and layout.index is not None:
            folding = self.chunks.pending_shard_keys(arr)  # (before the listing: a fold meanwhile is in one)
            entries = set(await blocking(list_entries, self.source, join(arr.path, rel)))
            for pending in folding:  # shards not folded into the source yet
                if not rel or pending.startswith(rel + "/"):
                    name, sep, _rest = pending[len(rel) + 1 if rel else 0:].partition("/")
                    entries.add(Entry(name, bool(sep)))
            ordered = sorted(entries)
            del entries
            names = np.array([name for name, _ in ordered], dtype=str)  # about 4 bytes a character
            dirs = np.array([is_dir for _, is_dir in ordered], dtype=bool)
            del ordered
            for at in range(0, len(names), PAGE):
                out = []
                rows = [(name, is_dir, join(rel, name)) for name, is_dir in
                        zip(names[at:at + PAGE].tolist(), dirs[at:at + PAGE].tolist())]
                shards = {sub: layout.keys.parse(sub) for name, is_dir, sub in rows if not is_dir}
                # a shard directory's mtime is its shard's version's: asked for the page at once
                # (those only a request tells come with their indexes, read ``INDEX_READS`` at a time)
                unknown = await self.indexes.shard_versions(arr, [c for c in shards.values() if c is not None])
                await self._read_tables(arr, unknown)
                for name, is_dir, sub in rows:
                    is_shard = shards.get(sub) is not None
                    if is_shard or (is_dir and layout.keys.is_prefix(sub)):
                        shown = name + ".shard" if is_shard and self.names.shard_suffix(arr) else name
                        ino = self.nodes.inode(ShardDirKey(arr.path, sub))
                        try:
                            out.append((shown, await self.names.getattr(ino)))
                        except OSError:
                            pass
                yield out
        if prefix is None:
            return
        found = await self.chunks.stored_shards(arr)
        stored = np.array(found, dtype=np.int64).reshape(len(found), layout.ndim)  # 8 bytes a coordinate
        del found
        fill = False
        if arr.shown.serve_missing:
            if int(np.prod(layout.chunk_grid, dtype=object)) <= LIST_FILL_MAX:
                fill = True
            elif not arr.fill_unlisted:
                arr.fill_unlisted = True
                log.warning("%s: more than %d inner chunks: empty ones are served but not listed",
                            self.source.describe(arr.path), LIST_FILL_MAX)
        if fill or layout.keys.view_separator == "/":
            chunks = ChunkSet.concat([c async for c in self._shard_chunk_sets(arr, stored)], layout.ndim)
            if fill:
                filled = self._with_fill_chunks(arr, chunks, len(await self.names.fill_file(arr)))
                if layout.keys.view_separator != "/":
                    for part in filled:
                        yield list(zip(layout.names.keys(part.coords), self._chunk_attrs(arr, part)))
                    return
                chunks = ChunkSet.concat(list(filled), layout.ndim)
            nested = self._nested(arr, chunks, prefix)
            del chunks
            for at in range(0, len(nested), PAGE):
                yield nested[at:at + PAGE]
            return
        held: list[ChunkSet] = []
        count = 0
        async for chunks in self._shard_chunk_sets(arr, stored):
            held.append(chunks)
            count += len(chunks.size)
            if count >= PAGE:
                async for page in self._chunk_pages(arr, ChunkSet.concat(held, layout.ndim)):
                    yield page
                held, count = [], 0
        async for page in self._chunk_pages(arr, ChunkSet.concat(held, layout.ndim)):
            yield page

    async def _chunk_pages(self, arr: ArrayNode, chunks: ChunkSet) -> AsyncIterator[Entries]:
        """The chunk files of ``chunks`` (v2 keys as names), at most ``PAGE`` at a time."""
        for at in range(0, len(chunks.size), PAGE):
            part = chunks.where(slice(at, at + PAGE))
            yield list(zip(arr.shown.layout.names.keys(part.coords), self._chunk_attrs(arr, part)))

    def _nested(self, arr: ArrayNode, chunks: ChunkSet, prefix: tuple[int, ...]) -> Entries:
        """With dimension_separator "/": the entries of key directory ``prefix`` (the chunk files
        named by their last coordinate, or the key directories of the next one)."""
        layout = arr.shown.layout
        depth = len(prefix)
        chunks = chunks.where(np.all(chunks.coords[:, :depth] == np.array(prefix, dtype=np.int64), axis=1))
        if depth + 1 == layout.ndim:
            return list(zip(map(str, chunks.coords[:, depth].tolist()), self._chunk_attrs(arr, chunks)))
        return [(str(i), self.names.dir_attr(self.nodes.inode(KeyDirKey(arr.path, prefix + (i,))),
                                            arr.version.mtime_ns))
                for i in sorted(set(chunks.coords[:, depth].tolist()))]

    async def _shard_chunk_sets(self, arr: ArrayNode, shards: np.ndarray) -> AsyncIterator[ChunkSet]:
        """``shards_chunks`` of ``shards`` (coordinates, one row each), as many shards at a time
        as hold at most ``PAGE`` inner chunks (at least one), their indexes read ``INDEX_BATCH``
        shards ahead."""
        group = max(1, PAGE // int(np.prod(arr.shown.layout.chunks_per_shard, dtype=np.int64)))
        for at in range(0, len(shards), INDEX_BATCH):
            batch = [tuple(row) for row in shards[at:at + INDEX_BATCH].tolist()]
            await self._read_tables(arr, batch)
            if at + INDEX_BATCH < len(shards):  # the next batch's, while the reader takes this one's
                ahead = [tuple(row) for row in shards[at + INDEX_BATCH:at + 2 * INDEX_BATCH].tolist()]
                trio.lowlevel.spawn_system_task(self._tables_ahead, arr, ahead)
            for first in range(0, len(batch), group):
                yield await self.chunks.shards_chunks(arr, batch[first:first + group])

    async def _list_box(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> list[tuple[str, Attr]]:
        """A shard or inner shard directory: its inner shards, or at the innermost level its chunks."""
        layout = arr.shown.layout
        chunks = await self.chunks.box_chunks(arr, level, box)
        if level == layout.depth:
            return list(zip(layout.names.keys(chunks.coords), self._chunk_attrs(arr, chunks)))
        newest: dict[tuple[int, ...], int] = {}
        for c, mtime in zip(map(tuple, (chunks.coords // np.array(layout.spans[level + 1])).tolist()),
                            chunks.mtime.tolist()):
            newest[c] = max(newest.get(c, 0), mtime)
        inode = self.nodes.inode
        return [(layout.names.key(child), self.names.dir_attr(inode(InnerShardKey(arr.path, level + 1, child)), mtime))
                for child, mtime in sorted(newest.items())]

    async def _read_tables(self, arr: ArrayNode, shards: list[tuple[int, ...]]) -> None:
        """``read_indexes`` of ``shards`` for a listing: split among the source's ``index_calls``
        worker thread calls at once (``Reads.index_calls``: one for a local source)."""
        calls = self.index_calls
        await self.indexes.read_indexes(arr, shards, calls, per_call=max(1, -(-len(shards) // calls)))

    async def _tables_ahead(self, arr: ArrayNode, shards: list[tuple[int, ...]]) -> None:
        """``_read_tables`` in the background (a listing may be abandoned meanwhile: at most one
        batch is read for nothing); a failure is left for the listing's own reads."""
        try:
            await self._read_tables(arr, shards)
        except Exception as e:  # noqa: BLE001 - a background read never ends the daemon
            log.debug("%s: indexes not read ahead: %r", self.source.describe(arr.path), e)

    def _with_fill_chunks(self, arr: ArrayNode, stored: ChunkSet, fill_size: int) -> Iterator[ChunkSet]:
        """Every in-bounds inner chunk in C order, ``PAGE`` at a time: ``stored`` ones as they
        are, the others as fill chunks (``fill_size`` bytes, the array metadata's mtime) but
        those unlinked through the mount (``Made.unfill``)."""
        grid = arr.shown.layout.chunk_grid
        total = int(np.prod(grid, dtype=np.int64))
        unfilled = [c for c in self.made.unfilled(arr.path) if arr.shown.layout.in_grid(c)]
        gone = self._linear(arr, np.array(unfilled, np.int64).reshape(len(unfilled), len(grid)))
        linear = self._linear(arr, stored.coords)
        order = np.argsort(linear, kind="stable")
        linear, size, mtime = linear[order], stored.size[order], stored.mtime[order]
        for at in range(0, total, PAGE):
            ids = np.arange(at, min(total, at + PAGE), dtype=np.int64)
            coords = (np.stack(np.unravel_index(ids, grid), axis=1).astype(np.int64) if grid
                      else np.zeros((len(ids), 0), np.int64))
            page = ChunkSet(coords, np.full(len(ids), fill_size, np.int64),
                            np.full(len(ids), arr.version.mtime_ns, np.int64))
            lo, hi = np.searchsorted(linear, [at, at + len(ids)])
            page.size[linear[lo:hi] - at], page.mtime[linear[lo:hi] - at] = size[lo:hi], mtime[lo:hi]
            yield page.where(~np.isin(ids, gone)) if len(gone) else page

    @staticmethod
    def _linear(arr: ArrayNode, coords: np.ndarray) -> np.ndarray:
        """The C-order positions in the array's chunk grid of ``coords``."""
        layout = arr.shown.layout
        if not layout.ndim:
            return np.zeros(len(coords), np.int64)
        return np.ravel_multi_index(tuple(coords.T), layout.chunk_grid).astype(np.int64)

    def _chunk_attrs(self, arr: ArrayNode, chunks: ChunkSet) -> list[Attr]:
        """The attributes of every chunk file of ``chunks`` (``_chunk_attr`` column-wise)."""
        base = CHUNK_BASE + (arr.slot << SLOT_SHIFT)
        return self.names.chunk_attrs(arr, (self._linear(arr, chunks.coords) + base).tolist(), chunks.size.tolist(),
                                     chunks.mtime.tolist())


class DirStream:
    """One open directory's entries as readdir asks for them (``Listing.pages``, consumed as
    the reader goes): entry ``i`` has offset ``i``, and the kernel resumes at the offset after
    the last entry it took. Only the current page is kept; ``rewind`` (readdir at offset 0)
    lists afresh, and an offset before the current page lists again from the start and skips
    to it (``seekdir`` back; a listing that failed is resumed the same way)."""

    def __init__(self, listing: Listing, ino: int) -> None:
        self._listing, self._ino = listing, ino
        self._pages: AsyncGenerator[Entries, None] | None = None
        self._base = 0  # the offset of the first entry of ``_page``
        self._page: Entries = []
        self._lock = trio.Lock()  # one reader of the listing at a time

    async def at(self, offset: int) -> tuple[Entries, int]:
        """The page holding the entry at ``offset`` and its index in that page (an empty page:
        the listing ended before ``offset``)."""
        async with self._lock:
            if self._pages is None or offset < self._base:
                await self._close()
                self._pages = self._listing.pages(self._ino)
            while offset >= self._base + len(self._page):
                try:
                    page = await self._pages.__anext__()
                except StopAsyncIteration:
                    return [], 0
                except BaseException:  # the listing failed (and ended): the next call starts it again
                    self._pages, self._base, self._page = None, 0, []
                    raise
                self._base += len(self._page)
                self._page = page
            return self._page, offset - self._base

    async def rewind(self) -> None:
        """The next ``at`` lists the directory afresh."""
        async with self._lock:
            await self._close()

    async def aclose(self) -> None:
        """Stop the listing (the directory is released)."""
        await self.rewind()

    async def _close(self) -> None:
        pages, self._pages, self._base, self._page = self._pages, None, 0, []
        if pages is not None:
            await pages.aclose()

