"""The virtual tree the mount shows: names, node kinds and what ``stat`` shows of them.

Which inode number shows which node (and staging files) is ``shardfs.tree.nodetable``
(``View.nodes``); what the kernel holds of these inodes (lookup counts, cached pages)
is ``shardfs.kernel.inodes``.

Node kinds are the key classes of ``shardfs.tree.nodes`` (group and array directories,
metadata files, shard and key directories, inner shards, chunk files, staging
files). A chunk file's inode is computed from the array's slot and the chunk's
C-order position, so a million chunk files cost no memory.

Every method here runs on the trio thread. Reads of file contents and
directory listings go through ``trio.to_thread``; ``stat`` and ``open`` of
source files are made inline, because they are answered from the kernel's
inode cache in microseconds while a trip to a worker thread costs far more
(and every lookup, getattr and open needs them). Errors are ``OSError`` with the errno to return.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import stat
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple

import numpy as np
import trio

from shardfs.tree import metadata
from shardfs.shards import shard as shard_mod
from shardfs.reads.chunkcache import ChunkCache
from shardfs.format.layout import Unpresentable, c_coords, c_linear, parse_coord
from shardfs.reads.attrs import Attr, fail, join, list_entries
from shardfs.tree.listing import ChunkSet, Listing
from shardfs.tree.nodetable import NodeTable
from shardfs.tree.nodes import (ARRAY_DIRS, ArrayDirKey, ArrayNode, ChunkKey, DirKey, GroupNode, InnerShardKey,
                                KeyDirKey, MetaKey, ShardDirKey, StagingKey)
from shardfs.reads import ReadHandle, Reads
from shardfs.reads.factory import make_reads
from shardfs.format.v2 import CorruptChunk
from shardfs.shards.shard import CorruptShard, Extent, IndexCache
from shardfs.storage import UNKNOWN, Range, Storage, Unusable, Version, VersionMismatch, _Unknown
from shardfs.storage.threads import blocking
from shardfs.writes.writeback import Pending, Writeback

if TYPE_CHECKING:
    from shardfs.format.v2 import ArrayInfo

log = logging.getLogger("shardfs")

OPEN_TRIES = 3  # opens of a chunk that find its shard replaced since its index was read, before EIO
PREFETCH_SHARDS = 6  # shards after a swept one fetched whole ahead, at least (objects; see ``_prefetch_after``)
PREFETCH_AT_ONCE = 6  # of those in flight at once; the others wait their turn, in the order asked
PREFETCH_MAX = 32  # shards after a swept one fetched ahead, at most (a sweep of a small region wastes no more)
INDEXES_AHEAD_MAX = 4096  # arrays with more stored shards never have their indexes read ahead
INDEXES_AHEAD_AT_ONCE = 8  # of those in flight at once (more slow the opens meanwhile: measured)
INDEXES_AHEAD_OTHER_KEYS = 16  # keys below an array besides its shards (zarr.json...) listed for that
INDEXES_PER_READ_BYTES = 1 << 20  # tables read in one call for a lookup (``Reads.indexes_per_read``), at most
RESOLVED_KEPT = 256  # chunk lookups remembered for the opens that follow them
SHARD_KEYS_KEPT = 4096  # shard keys remembered per array (formatting one costs more than a lookup)


class _Visit(NamedTuple):
    """The shard of an array opened last (``View._note_shard``)."""

    at: int  # its position in the shard grid, C order
    from_before: bool  # the shard opened before it was the one just before it
    asked: bool  # the shards after it were asked for during this visit
    ext: Extent  # a chunk opened in it this visit (the shard's version and size)


def v2() -> Any:
    """``shardfs.format.v2``, imported on first use: it brings in zarr (a quarter of a second), which
    nothing needs before the first metadata is read. The daemon (``cli``) imports it before
    it goes live."""
    from shardfs.format import v2 as module

    return module


def _read_metadata(source: Storage, key: str, known: Version | _Unknown) -> tuple[dict[str, Any] | str, Version]:
    """The parsed zarr.json at ``key``, or why it is bad (``shardfs.tree.metadata``), and the version
    read: one request of at most ``METADATA_MAX`` + 1 bytes (none if ``known``, its version,
    is too large already), in a worker thread."""
    reason = metadata.too_large(known.size) if isinstance(known, Version) else None
    if reason:
        return reason, known  # type: ignore[return-value]  # a Version: too_large found a reason
    data, version = source.read_versioned(key, Range(0, metadata.METADATA_MAX + 1))
    try:
        reason = metadata.too_large(version.size)
        if reason:
            raise metadata.BadMetadata(reason)
        return metadata.parse(data), version
    except metadata.BadMetadata as e:
        return str(e), version


def _versions_now(source: Storage, keys: list[str]) -> list[Version | None | _Unknown]:
    """``source.version_now`` of each of ``keys`` (None for one that is unusable: its getattr
    meets the error again, remembered)."""
    out: list[Version | None | _Unknown] = []
    for key in keys:
        try:
            out.append(source.version_now(key))
        except OSError:
            out.append(None)
    return out


class View:
    """The mount's tree over one source (a directory or an object-store prefix); chunk files
    are read through ``reads`` (default ``make_reads(source, chunk_cache=chunk_cache)``)."""

    def __init__(self, source: Storage, read_only: bool = True, writeback: Writeback | None = None,
                 ome: bool = True, chunk_cache: ChunkCache | None = None, reads: Reads | None = None,
                 c_order: bool = False) -> None:
        self.source = source
        self.reads = reads if reads is not None else make_reads(source, chunk_cache=chunk_cache)
        self.ome = ome
        self.c_order = c_order  # -o c_order (shardfs.format.v2.describe_array)
        self.read_only = read_only
        self.writeback = writeback
        self.mount_ns = time.time_ns()
        self.arrays: dict[str, ArrayNode] = {}
        self._slots: list[ArrayNode] = []
        self._groups: dict[str, GroupNode] = {}
        self.nodes = NodeTable(self._slots)  # inode numbers <-> node keys, staging files
        self.listing = Listing(self)  # directory listings and the stored chunks they show
        # Structure made through the mount that the source does not hold (yet):
        self.new_dirs: set[str] = set()  # directories made by mkdir, until a .zarray/.zgroup lands
        self.made: set[tuple[str, str]] = set()  # (array, rel): key directories made by mkdir
        self.hidden: set[tuple[str, str]] = set()  # (node, name): metadata files unlinked (rm -r)
        self.created: set[str] = set()  # arrays created through the mount (see _key_dir_shown)
        self.made_keys: set[tuple[str, tuple[int, ...]]] = set()  # (array, prefix): key dirs made there
        self.index_cache = IndexCache()
        self._index_reads: dict[str, trio.Event] = {}  # shard key -> its index being read
        self._ahead: deque[tuple[ArrayNode, str]] = deque()  # shards to fetch ahead of a sweep, in turn
        self._prefetching = 0  # shards being fetched ahead of a sweep
        self._last_shard: dict[str, _Visit] = {}  # array path -> its shard opened last (``_note_shard``)
        self._resolved: dict[int, tuple[Extent, Attr]] = {}  # chunk inode -> as last looked up (see open)
        self._unusable: set[tuple[str, str]] = set()  # (key, reason) already logged
        self._file_mode = 0o444 if read_only else 0o644
        self._dir_mode = 0o555 if read_only else 0o755

    async def version(self, key: str, ask: bool = True) -> Version | None | _Unknown:
        """``source.version`` (inline when it is answered at once, ``Storage.version_now``, else
        in a worker thread; ``UNKNOWN`` then if not ``ask``); a key that exists but is unusable (not a
        regular file, behind a symlink out of the source) raises its errno, logged once per key and reason."""
        try:
            return await self._current(key, ask)
        except Unusable as e:
            self._log_unusable(key, e)
            raise fail(e.errno, e.strerror) from None

    async def _current(self, key: str, ask: bool = True) -> Version | None | _Unknown:
        """``source.version``: inline when it is answered at once, else in a worker thread (or
        ``UNKNOWN`` if not ``ask``)."""
        found = self.source.version_now(key)
        return await blocking(self.source.version, key) if found is UNKNOWN and ask else found

    def _log_unusable(self, key: str, e: Unusable) -> None:
        """Log why ``key`` is not read, once per key and reason."""
        if (key, e.strerror) not in self._unusable:
            if len(self._unusable) >= 4096:
                self._unusable.clear()
            self._unusable.add((key, e.strerror))
            log.error("%s: not read: %s", self.source.describe(key), e.strerror)

    # ----- metadata of the hierarchy ------------------------------------------------------

    async def node(self, path: str) -> ArrayNode | GroupNode | None:
        """The group or array at ``path`` (re-read when its zarr.json changes), or None if
        ``path`` has no zarr.json (or only one behind a symlink out of the source).

        A bad zarr.json (``shardfs.tree.metadata``), and an array that cannot be shown as v2,
        give an ``ArrayNode`` without ``info``: a directory without metadata or entries,
        whose ``error`` (also logged once per version of the file) says why.
        """
        key = join(path, "zarr.json")
        arr, group = self.arrays.get(path), self._groups.get(path)
        version: Version | None | _Unknown = UNKNOWN
        try:  # a node seen before is checked (a stat, a HEAD); a new one is read in one request
            version = await self._current(key, ask=arr is not None or group is not None)
            if version is None:
                return None
            if arr is not None and arr.version == version and arr.image == self._in_image(path):
                return arr
            if group is not None and group.version == version:
                return group
            doc, version = await blocking(_read_metadata, self.source, key, version)
        except Unusable as e:  # never read from: not a regular file (opened non-blocking), or out of SRC
            if e.errno == errno.EIO:  # not a regular file: a node without metadata, saying why
                return self._store_array(path, Version(0, 0, self.mount_ns), None, f"zarr.json: {e.strerror}")
            self._log_unusable(key, e)  # behind a symlink out of the source: as if absent
            return None
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.EIO:  # a failed read (a store that did not answer, logged there):
                raise fail(errno.EIO) from None  # this request alone fails
            doc = f"zarr.json is unreadable: {e.strerror or e}"
            version = version if isinstance(version, Version) else Version(0, 0, self.mount_ns)
        assert isinstance(version, Version)  # read above, or made for an unreadable file
        if isinstance(doc, str):
            return self._store_array(path, version, None, doc)
        try:
            if doc["node_type"] == "group":
                zgroup, zattrs = v2().group_files(doc, self.ome)
                attrs = doc.get("attributes")
                node = GroupNode(path, version, zgroup, zattrs, isinstance(attrs, dict) and v2().is_ome_image(attrs))
                self._groups[path] = node
                return node
            parent = await self.node(path.rpartition("/")[0]) if path else None
            image = isinstance(parent, GroupNode) and parent.image
            info = v2().describe_array(doc, self.ome, image, self.c_order)
            if image and info.layout.keys.view_separator != "/":
                log.warning("%s: OME-Zarr array with v2 \"/\" chunk keys: its v2 keys keep \".\" (the source's "
                            "directories of shards take the \"/\" names)", self.source.describe(key))
            return self._store_array(path, version, info, None, image,
                                     parent.version.mtime_ns if image else 0)
        except (metadata.BadMetadata, Unpresentable) as e:
            return self._store_array(path, version, None, str(e))
        except OSError as e:  # the parent group's metadata (a failed read: this request alone fails)
            if e.errno == errno.EIO:
                raise fail(errno.EIO) from None
            return self._store_array(path, version, None, f"zarr.json is unreadable: {e.strerror or e}")
        except Exception as e:  # zarr's metadata classes raise many types for bad documents
            return self._store_array(path, version, None, f"invalid metadata: {e!r}")

    def _store_array(self, path: str, version: Version, info: ArrayInfo | None, error: str | None,
                     image: bool | None = None, parent_mtime_ns: int = 0) -> ArrayNode:
        """Remember the array (or hidden node) at ``path``; a hidden node's reason is logged
        when it is new or changed. ``image``: in an OME-Zarr image group (None: as last read)."""
        image = self._in_image(path) if image is None else image
        old = self.arrays.get(path)
        if error is not None and old is not None and (old.version, old.error, old.image) == (version, error, image):
            return old
        if error is not None:
            log.error("%s: not shown as v2: %s", self.source.describe(path), error)
        # A new layout (a resize, or an array deleted and made again) gets a new slot: the
        # kernel may still hold dentries of the old chunk inodes, which keep naming the old
        # geometry's chunks instead of other chunks of the new one.
        same = old is not None and (old.info.layout if old.info else None) == (info.layout if info else None)
        slot = old.slot if same else len(self._slots)
        lineage = old.lineage if old is not None else []
        arr = ArrayNode(path, slot, version, info, error, image=image, parent_mtime_ns=parent_mtime_ns,
                        lineage=lineage)
        if not same:
            self._slots.append(arr)
            lineage.append(slot)
        else:
            self._slots[slot] = arr
        self.arrays[path] = arr
        return arr

    def _in_image(self, path: str) -> bool:
        """True if the array at ``path`` is in an OME-Zarr image or label group, as last read
        (no I/O: the group is re-read whenever it is looked at, and its arrays follow)."""
        parent = self._groups.get(path.rpartition("/")[0]) if path else None
        return parent is not None and parent.image

    # ----- shard indexes ------------------------------------------------------------------

    def array(self, path: str) -> ArrayNode | None:
        return self.arrays.get(path)

    def shard_key(self, arr: ArrayNode, shard: tuple[int, ...]) -> str:
        """The source key of ``shard`` of ``arr`` (remembered: every lookup and open asks it)."""
        key = arr.shard_keys.get(shard)
        if key is None:
            if len(arr.shard_keys) >= SHARD_KEYS_KEPT:
                arr.shard_keys.clear()
            key = arr.shard_keys[shard] = join(arr.path, arr.info.layout.keys.key(shard))
        return key

    async def shard_table(self, arr: ArrayNode, shard: tuple[int, ...], key: str = ""
                          ) -> tuple[Version, np.ndarray] | None:
        """The index of a stored shard (cached by version), None if the shard does not exist;
        ``key``: its ``shard_key``, if the caller has it.

        A shard whose index was read before is checked against its current version (a stat;
        for objects a HEAD at most once per ``stat_ttl``); one never read, or found changed, is
        read in one request that also gives its version (once: concurrent callers wait for
        that read). A corrupt shard raises EIO and is logged once per version. A shard never
        read is first read together with the next shards in C order (``_read_with_next``).
        """
        key = key or self.shard_key(arr, shard)
        layout = arr.info.layout
        with_next = self.reads.indexes_per_read > 1
        while True:
            asked = self.index_cache.latest(key) is not None or layout.index is None
            version = UNKNOWN if key in self._index_reads else await self.version(key, ask=asked)
            reading = self._index_reads.get(key)  # (also one begun while the version was asked)
            if reading is not None:  # its index being read, or the shard fetched whole ahead: that
                await reading.wait()  # read also tells its version
                continue
            if version is None:
                return None
            if layout.index is None:
                return version, np.array([[0, version.size]], dtype=np.uint64)  # type: ignore[union-attr, return-value]  # asked: a Version
            if version is not UNKNOWN:
                cached = self.index_cache.get(key, version)  # type: ignore[arg-type]  # not UNKNOWN (checked)
                if cached is not None:
                    if isinstance(cached, CorruptShard):
                        raise fail(errno.EIO)
                    return version, cached  # type: ignore[return-value]  # not UNKNOWN (checked)
            if with_next and self.index_cache.latest(key) is None:
                with_next = False  # once: what that read did not cache is read alone below
                await self._read_with_next(arr, shard)
            else:
                break
        self._index_reads[key] = reading = trio.Event()
        result: tuple[Version, np.ndarray] | None | CorruptShard | Unusable
        try:
            try:
                result = await blocking(shard_mod.read_index_sync, self.source, key, layout.index)
            except (CorruptShard, Unusable) as e:
                result = e
            return self._index_read(key, result)
        finally:
            del self._index_reads[key]
            reading.set()

    async def _read_with_next(self, arr: ArrayNode, shard: tuple[int, ...]) -> None:
        """Read the index of never-read ``shard`` together with those of the shards after it in
        C order of the shard grid that were never read and are not being read, up to
        ``Reads.indexes_per_read`` shards in all (as far as their tables stay within
        ``INDEXES_PER_READ_BYTES``), in one worker thread call (``read_tables``): a client
        looking up or opening chunk files one at a time needs them next, and a thread hop per
        index costs more than reading a small one. Only the tables read are cached: a shard
        found corrupt, unusable or unreadable is left for its own ``shard_table`` to read
        (and log), so the client sees no error before it asks for that shard."""
        layout = arr.info.layout
        grid = layout.shard_grid
        most = min(self.reads.indexes_per_read, INDEXES_PER_READ_BYTES // (16 * math.prod(layout.chunks_per_shard)))
        at = c_linear(shard, grid)
        shards = [shard]
        for nxt in range(at + 1, min(at + most, math.prod(grid))):
            coords = c_coords(nxt, grid)
            key = self.shard_key(arr, coords)
            if self.index_cache.latest(key) is None and key not in self._index_reads:
                shards.append(coords)
        await self.read_tables(arr, shards, failures=False)

    async def read_tables(self, arr: ArrayNode, shards: list[tuple[int, ...]], failures: bool = True) -> None:
        """Read the indexes of those of ``shards`` never read and not being read, in one worker
        thread call (``read_indexes_sync``: one thread hop, and no version asked first, for many
        small shards), and cache them as ``shard_table`` does (a corrupt or unusable shard is
        logged; with ``failures`` False neither cached nor logged); other errors are left for
        ``shard_table`` to meet again. Returns when those being read by others were read too."""
        layout = arr.info.layout
        if layout.index is None:
            return
        keys = [key for key in dict.fromkeys(self.shard_key(arr, shard) for shard in shards)
                if self.index_cache.latest(key) is None]
        elsewhere = {id(event): event for event in map(self._index_reads.get, keys) if event is not None}
        keys = [key for key in keys if key not in self._index_reads]
        reading = trio.Event()
        for key in keys:
            self._index_reads[key] = reading
        try:
            results = await blocking(shard_mod.read_indexes_sync, self.source, keys, layout.index) if keys else []
            for key, result in zip(keys, results):
                if isinstance(result, tuple) or (failures and isinstance(result, (CorruptShard, Unusable))):
                    try:
                        self._index_read(key, result)
                    except OSError:
                        pass
        finally:
            for key in keys:
                del self._index_reads[key]
            reading.set()
        for event in elsewhere.values():  # read by others: wait for them too
            await event.wait()

    async def shard_versions(self, arr: ArrayNode, shards: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Ask the versions of ``shards`` the source answers at once (``version_now``: a local
        stat each, remembered for the getattrs that follow) in one worker thread call; those
        only a request would tell (objects not remembered) are returned."""
        keys = [self.shard_key(arr, shard) for shard in shards]
        found = await blocking(_versions_now, self.source, keys)
        return [shard for shard, version in zip(shards, found) if version is UNKNOWN]

    def _index_read(self, key: str, result: tuple[Version, np.ndarray] | None | CorruptShard | Unusable
                    ) -> tuple[Version, np.ndarray] | None:
        """What a read of ``key``'s index found, cached (a corrupt shard too, logged once per
        version; an unusable one logged once per reason, then raised as its errno)."""
        if isinstance(result, CorruptShard):
            log.error("%s: corrupt shard: %s", self.source.describe(key), result)
            self.index_cache.put(key, result.version, result)
            raise fail(errno.EIO)
        if isinstance(result, Unusable):
            self._log_unusable(key, result)
            raise fail(result.errno, result.strerror)
        if result is not None:
            self.index_cache.put(key, *result)
        return result

    async def extent(self, arr: ArrayNode, coords: tuple[int, ...]) -> Extent | Pending | None:
        """Where inner chunk ``coords`` is: pending in the writeback, stored in a shard, or
        None if it is empty or outside the grid. Object sources: a cold chunk of the shard
        after a swept one fetches it whole with the shards after it (``_walk_on``); another
        cold chunk other than its shard's first starts reading the array's indexes ahead
        (``_indexes_ahead``)."""
        layout = arr.info.layout
        if not layout.in_grid(coords):
            return None
        shard, pos = layout.locate(coords)
        pending = self.writeback.pending((arr.path, shard), pos) if self.writeback else None
        if pending is not None:
            return pending if pending.data is not None else None
        if self.reads.prefetches and arr.path in self._last_shard:
            self._walk_on(arr, shard)
        if pos and not arr.indexes_ahead and self.reads.prefetches:
            self._indexes_ahead(arr, shard)
        key = self.shard_key(arr, shard)
        found = await self.shard_table(arr, shard, key)
        if found is None:
            return None
        version, table = found
        try:
            return shard_mod.extent(key, version, table, pos)
        except CorruptShard:  # its inner shard; logged when the shard's table was read
            raise fail(errno.EIO) from None

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
        return stat.S_IFREG | self._file_mode, 1 if arr.info.layout.index is None else 2

    def file_attr(self, ino: int, size: int, mtime_ns: int) -> Attr:
        """What ``stat`` shows for a metadata or staging file: a regular file with the mount's
        file mode, listed in one directory."""
        return Attr(ino, stat.S_IFREG | self._file_mode, size, mtime_ns)

    def chunk_attr(self, arr: ArrayNode, ino: int, size: int, mtime_ns: int) -> Attr:
        """``chunk_attrs`` of one chunk file (every lookup asks: without the lists)."""
        mode, nlink = self._chunk_kind(arr)
        return Attr(ino, mode, size if size > 0 else 0, mtime_ns, nlink)

    def _chunk_attr(self, arr: ArrayNode, coords: tuple[int, ...], where: Extent | Pending) -> Attr:
        """The attributes of a stored or pending inner chunk's file."""
        if isinstance(where, Pending):
            stored, mtime_ns = len(where.data), where.mtime_ns
        else:
            stored, mtime_ns = where.nbytes, where.version.mtime_ns
        return self.chunk_attr(arr, self.nodes.chunk_ino(arr, coords), int(arr.info.chunk.file_size(stored)), mtime_ns)

    # ----- name resolution ----------------------------------------------------------------

    async def lookup(self, parent: int, name: str) -> Attr:
        """The attributes of entry ``name`` of directory ``parent``; ENOENT if none."""
        key = self.nodes.node_key(parent)
        if self.nodes.staged and (parent, name) in self.nodes.staged:
            return await self.getattr(self.nodes.staged[(parent, name)].ino)
        if isinstance(key, DirKey):
            node = await self.node(key.path)
            if node is None or isinstance(node, GroupNode):  # (an array's entries are no paths of their own)
                child = join(key.path, name)
                if child in self.new_dirs:
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
            return await self._chunk_entry(arr, coords)
        return await self._lookup_dir(arr, key, name)

    @staticmethod
    def box_of(arr: ArrayNode, key: DirKey | ArrayDirKey) -> tuple[int, tuple[int, ...]] | None:
        """``(level, box)`` if ``key`` is a shard directory (level 0) or an inner shard (level >= 1)."""
        if isinstance(key, InnerShardKey):
            return key.level, key.box
        shard = arr.info.layout.keys.parse(key.rel) if isinstance(key, ShardDirKey) else None
        return None if shard is None else (0, shard)

    def _chunk_named(self, arr: ArrayNode, key: DirKey | ArrayDirKey, name: str) -> tuple[int, ...] | None:
        """The inner chunk whose file is entry ``name`` of directory ``key`` of array ``arr``, if
        ``name`` spells one (in the grid or not, stored or not): the one place that says which
        directories hold which chunk names."""
        layout = arr.info.layout
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
        layout = arr.info.layout
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
                    and self._key_dir_shown(arr, prefix + (i,)):
                return await self.getattr(self.nodes.inode(KeyDirKey(arr.path, prefix + (i,))))
        rel = key.rel if isinstance(key, ShardDirKey) else "" if isinstance(key, DirKey) else None
        if rel is not None and layout.index is not None:
            sub = self._source_name(arr, name)
            sub = None if sub is None else join(rel, sub)
            if sub is not None and (layout.keys.is_prefix(sub) or layout.keys.parse(sub) is not None):
                return await self.getattr(self.nodes.inode(ShardDirKey(arr.path, sub)))
        raise fail(errno.ENOENT)

    def _key_dir_shown(self, arr: ArrayNode, prefix: tuple[int, ...]) -> bool:
        """Whether key directory ``prefix`` (dimension_separator "/") resolves. Every prefix in
        the grid does, except in arrays created through this mount, where one resolves once
        made (``mkdir``) or once a chunk below it was written (all of such an array's chunks
        were): ``cp -r`` makes them after the .zarray, and the kernel answers its mkdir with
        EEXIST if the lookup succeeds."""
        return arr.path not in self.created or (arr.path, prefix) in self.made_keys

    def _source_name(self, arr: ArrayNode, name: str) -> str | None:
        """Source entry name for view entry ``name`` (1-D v2 keys carry a ``.shard`` suffix)."""
        if not self.shard_suffix(arr):
            return name
        return name[: -len(".shard")] if name.endswith(".shard") else None

    @staticmethod
    def shard_suffix(arr: ArrayNode) -> bool:
        keys = arr.info.layout.keys
        return keys.kind == "v2" and keys.ndim <= 1

    async def _chunk_entry(self, arr: ArrayNode, coords: tuple[int, ...]) -> Attr:
        ext = await self.extent(arr, coords)
        if ext is not None:
            attr = self._chunk_attr(arr, coords, ext)
            if isinstance(ext, Extent):  # for the open that usually follows
                if len(self._resolved) >= RESOLVED_KEPT:
                    self._resolved.clear()
                self._resolved[attr.ino] = (ext, attr)
            return attr
        if not (arr.info.serve_missing and arr.info.layout.in_grid(coords)):
            raise fail(errno.ENOENT)
        # an empty chunk served as the fill chunk, unchanged since the array's metadata was
        size = len(await self.fill_file(arr))
        return self.chunk_attr(arr, self.nodes.chunk_ino(arr, coords), size, arr.version.mtime_ns)

    async def fill_file(self, arr: ArrayNode) -> bytes:
        """The chunk file of an empty inner chunk of ``arr`` (encoded once per array)."""
        if arr.fill_file is None:
            arr.fill_file = await blocking(arr.info.fill_file)
        return arr.fill_file

    # ----- shard and inner shard directories --------------------------------------------------

    async def box_chunks(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> ChunkSet:
        """The stored chunks of shard ``box`` (level 0) or of a nested inner shard (level >= 1)."""
        layout = arr.info.layout
        chunks = await self.listing.shard_chunks(arr, layout.box(layout.box_origin(box, level), 0))
        if level == 0:
            return chunks
        return chunks.where(np.all(chunks.coords // np.array(layout.spans[level]) == np.array(box), axis=1))

    async def _box_attr(self, arr: ArrayNode, level: int, box: tuple[int, ...]) -> Attr:
        """An inner shard directory exists while it holds chunks; its mtime is their newest."""
        chunks = await self.box_chunks(arr, level, box)
        if not len(chunks.mtime):
            raise fail(errno.ENOENT)
        return self.dir_attr(self.nodes.inode(InnerShardKey(arr.path, level, box)), int(chunks.mtime.max()))

    def meta_names(self, node: ArrayNode | GroupNode) -> tuple[str, ...]:
        """The metadata files shown in a node's directory (not those unlinked through the mount)."""
        if isinstance(node, GroupNode):
            names: tuple[str, ...] = (".zgroup", ".zattrs", ".zmetadata")
        else:
            names = (".zarray", ".zattrs") if node.info is not None else ()
        return tuple(n for n in names if (node.path, n) not in self.hidden) if self.hidden else names

    def new_children(self, path: str) -> list[str]:
        """Names of the directories made by mkdir directly below ``path``."""
        return sorted(d.rpartition("/")[2] for d in self.new_dirs if d.rpartition("/")[0] == path and d)

    async def meta_bytes(self, node: ArrayNode | GroupNode, name: str) -> bytes:
        """Content of a v2 metadata file; ``.zmetadata`` is consolidated on demand."""
        if name == ".zmetadata":
            found: dict[str, Any] = {}
            await self._consolidate(node, "", found)
            return v2().to_json({"zarr_consolidated_format": 1, "metadata": found})
        if isinstance(node, GroupNode):
            return node.zgroup if name == ".zgroup" else node.zattrs
        return node.info.zarray if name == ".zarray" else node.info.zattrs

    async def _meta_file(self, ino: int, key: MetaKey) -> tuple[Attr, bytes]:
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
        key = self.nodes.node_key(ino)
        if isinstance(key, ChunkKey):
            return await self._chunk_entry(key.arr, key.coords)
        if isinstance(key, StagingKey):
            st = key.staging
            return self.file_attr(ino, st.data.size, st.mtime_ns)
        if isinstance(key, DirKey):
            node = await self.node(key.path)
            if node is None:
                if key.path in self.new_dirs:
                    return self.dir_attr(ino, self.mount_ns)
                raise fail(errno.ENOENT)
            return self.dir_attr(ino, node.version.mtime_ns)
        if isinstance(key, MetaKey):
            return (await self._meta_file(ino, key))[0]
        arr = self.arrays[key.path]
        if isinstance(key, ShardDirKey):
            src = join(arr.path, key.rel)
            shard = arr.info.layout.keys.parse(key.rel)
            if shard is not None:
                version = await self.version(src, ask=False)
                if version is UNKNOWN:  # only a request would tell: read it with the index (needed next)
                    try:
                        found = await self.shard_table(arr, shard)
                        version = None if found is None else found[0]
                    except OSError:  # corrupt (logged once): the version that read remembered
                        version = await self.version(src)
                if isinstance(version, Version):  # (asked: not UNKNOWN)
                    return self.dir_attr(ino, version.mtime_ns)
                if key.rel in self.pending_shard_keys(arr) or (arr.path, key.rel) in self.made:
                    return self.dir_attr(ino, self.mount_ns)
                raise fail(errno.ENOENT)
            if (not await blocking(self.source.is_dir, src) and (arr.path, key.rel) not in self.made
                    and not any(k.startswith(key.rel + "/") for k in self.pending_shard_keys(arr))):
                raise fail(errno.ENOENT)
            return self.dir_attr(ino, arr.version.mtime_ns)
        if isinstance(key, InnerShardKey):
            return await self._box_attr(arr, key.level, key.box)
        return self.dir_attr(ino, arr.version.mtime_ns)  # KeyDirKey

    def pending_shard_keys(self, arr: ArrayNode) -> set[str]:
        """Keys (below the array) of the shards with pending chunks: their directories exist
        before the first fold creates them in the source."""
        if self.writeback is None:
            return set()
        return {arr.info.layout.keys.key(shard) for shard in self.writeback.dirty_shards(arr.path)
                if any(p.data is not None for p in self.writeback.pending_in((arr.path, shard)).values())}

    def dir_attr(self, ino: int, mtime_ns: int) -> Attr:
        return Attr(ino, stat.S_IFDIR | self._dir_mode, 0, mtime_ns, 2)

    async def chunk_at_name(self, parent: int, name: str) -> tuple[ArrayNode, tuple[int, ...]] | None:
        """The inner chunk that entry ``name`` of directory ``parent`` names, if any (stored or not)."""
        key = self.nodes.node_key(parent)
        if isinstance(key, DirKey):
            arr = await self.node(key.path)
            if not isinstance(arr, ArrayNode) or arr.info is None:
                return None
        elif isinstance(key, ARRAY_DIRS):
            arr = self.arrays[key.path]
        else:
            return None
        coords = self._chunk_named(arr, key, name)
        return (arr, coords) if coords is not None and arr.info.layout.in_grid(coords) else None

    async def dir_node(self, ino: int) -> tuple[DirKey | ArrayDirKey, ArrayNode | GroupNode | None]:
        """``(key, node)`` of a directory inode: its key and the group/array it shows or belongs to."""
        key = self.nodes.node_key(ino)
        if isinstance(key, DirKey):
            return key, await self.node(key.path)
        if isinstance(key, ARRAY_DIRS):
            return key, self.arrays[key.path]
        raise fail(errno.ENOTDIR)

    # ----- reading ------------------------------------------------------------------------

    async def open(self, ino: int) -> ReadHandle:
        """Open a file for reading: metadata bytes, a staging file, or a stored, pending or
        empty chunk (``Reads.open``). A shard replaced between its index read and the open is
        looked up again, ``OPEN_TRIES`` times, then EIO (logged)."""
        key = self.nodes.node_key(ino)
        if isinstance(key, MetaKey):
            attr, data = await self._meta_file(ino, key)
            return ReadHandle(ino, attr, data=data)
        if isinstance(key, StagingKey):
            return ReadHandle(ino, await self.getattr(ino), buffer=key.staging.data)
        if not isinstance(key, ChunkKey):
            raise fail(errno.EISDIR)
        arr, coords = key.arr, key.coords
        resolved = self._resolved.pop(ino, None)
        ext: Extent | Pending | None
        for _ in range(OPEN_TRIES):
            if resolved is not None and self._unchanged(arr, coords, resolved[0]):
                ext, attr = resolved
            else:
                ext = await self.extent(arr, coords)
                attr = None
            resolved = None
            if ext is None:
                attr = await self._chunk_entry(arr, coords)  # ENOENT unless empty chunks are served
                return ReadHandle(ino, attr, data=await self.fill_file(arr))
            attr = attr or self._chunk_attr(arr, coords, ext)
            if isinstance(ext, Pending):
                return ReadHandle(ino, attr, data=await blocking(self._decode, arr, coords, ext.data))
            decode = functools.partial(self._decode, arr, coords, key=ext.key) if arr.info.chunk.decodes else None
            first = self.reads.prefetches and not any(c % n for c, n in zip(coords, arr.info.layout.chunks_per_shard))
            try:
                handle = await self.reads.open(ino, attr, ext, decode, first)
            except VersionMismatch:  # replaced since its version was remembered: look again
                self.source.changed(ext.key)
                self.index_cache.forget(ext.key)
                continue
            if self.reads.prefetches:
                self._note_shard(arr, coords, ext)
            return handle
        assert isinstance(ext, Extent)  # only an open of a stored chunk tries again
        log.error("%s: changed during %d opens of chunk %s", self.source.describe(ext.key), OPEN_TRIES,
                  arr.info.layout.names.key(coords))
        raise fail(errno.EIO, "shard keeps changing")

    def _note_shard(self, arr: ArrayNode, coords: tuple[int, ...], ext: Extent) -> None:
        """A chunk of ``arr`` at ``ext`` was opened: when the client sweeps its shard
        (``ReadAhead.swept``: 3 of its chunks among the last opens, so a client reading two
        chunks of each of a few shards is no walk) and came to it from the shard just before it
        in C order of the shard grid
        (the order a sweep of the chunk grid in C order reaches shards, also when its rows cross
        several), it walks the array: fetch the shards after it ahead (``_prefetch_after``),
        once per visit of the shard until all of them were (a sweep whose rows cross several
        shards visits each many times: a visit after that costs no look at the shards after).
        The shard last opened is remembered for ``_walk_on``."""
        layout = arr.info.layout
        at = c_linear(layout.locate(coords)[0], layout.shard_grid)
        last = self._last_shard.get(arr.path)
        if last is None or last.at != at:
            if len(self._last_shard) >= SHARD_KEYS_KEPT:
                self._last_shard.clear()
            last = self._last_shard[arr.path] = _Visit(at, last is not None and last.at == at - 1, False, ext)
        if last.from_before and not last.asked and at not in arr.covered and self.reads.ahead.swept(ext):
            self._last_shard[arr.path] = _Visit(at, True, True, ext)
            self._prefetch_after(arr, at, ext.version.size)

    def _walk_on(self, arr: ArrayNode, shard: tuple[int, ...]) -> None:
        """A chunk of ``shard`` is looked up or opened (object sources). If it is ``_cold``
        (its index never read, or its bytes evicted since), and the shard opened last in
        ``arr`` is the one before it in C order and was swept (``ReadAhead.swept``), the client
        walks on from that one: zarr 2.18 reading the array row by row crosses from the first shard to the second
        this way. Then fetch this shard whole in one GET (which also tells its index) together
        with the shards after it (``_prefetch_after``), instead of reading its index first,
        then the rest of it, and only then the shards after it."""
        last = self._last_shard[arr.path]
        at = c_linear(shard, arr.info.layout.shard_grid)
        if last.at != at - 1 or not self._cold(self.shard_key(arr, shard)) or not self.reads.ahead.swept(last.ext):
            return
        # a shard read before and evicted since: what ``arr.covered`` says was fetched ahead
        # of the sweep may be gone too (a sweep again of an array larger than the cache)
        arr.covered.clear()
        self._prefetch_after(arr, at - 1, last.ext.version.size)

    def _cold(self, key: str) -> bool:
        """Whether fetching the shard at ``key`` whole ahead saves its opens a request: it is
        not being read, and its index was never read or its bytes are no longer kept
        (``Reads.kept``)."""
        if key in self._index_reads:
            return False
        version = self.index_cache.latest(key)
        return version is None or not self.reads.kept(key, version)

    def _prefetch_after(self, arr: ArrayNode, at: int, size: int) -> None:
        """Fetch the shards after the one at ``at`` (linear, C order) in the background, each
        whole in one GET (with a disk cache: their indexes alone, which tell the ETag the
        cached chunks are under), those that are ``_cold``:
        as many as a plane of chunks crosses (``prod(shard_grid[1:])``, at least
        ``PREFETCH_SHARDS``), since a sweep in C order of the chunk grid comes back to the
        shards of one plane until it has read them all, then enters the next plane's, which are
        then fetched already; but no more than ``PREFETCH_MAX`` (what a sweep of a small region
        may fetch for nothing) nor than ``Reads.room_ahead`` shards of ``size``.
        ``PREFETCH_AT_ONCE`` are fetched at once, the others wait their turn in C order (the
        order the sweep needs them). Their index is cached from the bytes fetched; an open
        meanwhile waits for the fetch as for an index read. The shards after ``at`` count as
        asked for (``arr.covered``) from then on."""
        grid = arr.info.layout.shard_grid
        if len(arr.covered) >= SHARD_KEYS_KEPT:
            arr.covered.clear()
        arr.covered.add(at)
        lead = min(max(PREFETCH_SHARDS, math.prod(grid[1:])), PREFETCH_MAX, self.reads.room_ahead(size))
        for nxt in range(at + 1, min(at + 1 + lead, math.prod(grid))):
            key = self.shard_key(arr, c_coords(nxt, grid))
            if not self._cold(key):
                continue
            self._index_reads[key] = trio.Event()
            self._ahead.append((arr, key))
        self._next_prefetch()

    def _next_prefetch(self) -> None:
        """Start fetching the shards asked for by ``_prefetch_after`` in turn, up to
        ``PREFETCH_AT_ONCE`` at once."""
        while self._ahead and self._prefetching < PREFETCH_AT_ONCE:
            arr, key = self._ahead.popleft()
            try:
                trio.lowlevel.spawn_system_task(self._prefetch, arr, key)
            except RuntimeError:  # the trio run is ending: not fetched
                self._index_reads.pop(key).set()
                continue
            self._prefetching += 1

    async def _prefetch(self, arr: ArrayNode, key: str) -> None:
        """Fetch the shard at ``key`` whole and cache its index (see ``_prefetch_after``); a
        failure is left for the opens' own reads to meet (logged at debug level)."""
        fmt = arr.info.layout.index
        try:
            fetched = await self.reads.fetch_whole(key)
            if fetched is not None:
                data, version = fetched
                self.index_cache.put(key, version, shard_mod.table_of_whole(self.source, key, fmt, version, data))
            else:
                found = await blocking(shard_mod.read_index_sync, self.source, key, fmt)
                if found is not None:
                    self.index_cache.put(key, *found)
        except Exception as e:  # noqa: BLE001 - a background fetch never ends the daemon
            log.debug("%s: not fetched ahead: %r", self.source.describe(key), e)
        finally:
            self._prefetching -= 1
            self._index_reads.pop(key).set()
            self._next_prefetch()

    def _indexes_ahead(self, arr: ArrayNode, shard: tuple[int, ...]) -> None:
        """A chunk of ``shard`` other than its first is looked up (object sources): if the
        shard's index is neither cached nor being read, the client reads scattered chunks (a
        sweep in C order comes to a shard at its first chunk, which fetches the shard whole),
        each cold one costing two round trips (its index, then its bytes). So read the indexes
        of all the array's stored shards ahead, in the background, once per array version
        (``_read_indexes_ahead``): the scattered reads that follow cost one round trip."""
        key = self.shard_key(arr, shard)
        if self.index_cache.latest(key) is not None or key in self._index_reads or arr.info.layout.index is None:
            return
        arr.indexes_ahead = True
        trio.lowlevel.spawn_system_task(self._read_indexes_ahead, arr)

    async def _read_indexes_ahead(self, arr: ArrayNode) -> None:
        """Read the indexes of the stored shards of ``arr``, ``INDEXES_AHEAD_AT_ONCE`` at a time
        (``Listing.read_indexes``: through ``shard_table``, sharing a read in flight with the
        opens that need it), if a listing of at most ``INDEXES_AHEAD_MAX`` keys names them and
        their tables fit a quarter of the index cache; a failure is left for the opens' own
        reads (logged at debug level)."""
        layout = arr.info.layout
        table_bytes = 16 * int(np.prod(layout.chunks_per_shard))  # (offset, nbytes) uint64 per inner chunk
        most = min(INDEXES_AHEAD_MAX, self.index_cache.max_bytes // 4 // table_bytes)
        try:
            keys = await self.reads.keys_below(arr.path, most + INDEXES_AHEAD_OTHER_KEYS)
            shards = [c for c in map(layout.keys.parse, keys or ()) if c is not None and layout.shard_in_grid(c)]
            if keys is not None and len(shards) <= most:
                await self.listing.read_indexes(arr, shards, INDEXES_AHEAD_AT_ONCE)
        except Exception as e:  # noqa: BLE001 - a background read never ends the daemon
            log.debug("%s: indexes not read ahead: %r", self.source.describe(arr.path), e)

    def _unchanged(self, arr: ArrayNode, coords: tuple[int, ...], ext: Extent) -> bool:
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
        shard, pos = arr.info.layout.locate(coords)
        return self.writeback.pending((arr.path, shard), pos) is None

    def _decode(self, arr: ArrayNode, coords: tuple[int, ...], stored: bytes, key: str = "") -> bytes:
        """A chunk file's bytes from its stored form (checksum/transcoding); EIO if corrupt
        (logged). Blocking."""
        try:
            return arr.info.chunk.to_file(stored)
        except CorruptChunk as e:
            where = self.source.describe(key or arr.path)
            log.error("%s: corrupt chunk %s: %s", where, arr.info.layout.names.key(coords), e)
            raise fail(errno.EIO) from None

    async def read(self, handle: ReadHandle, offset: int, size: int) -> bytes | bytearray | memoryview:
        """``Reads.read``: up to ``size`` bytes at ``offset``, possibly a view of a buffer that
        the next read reuses, so copy or reply before awaiting anything else."""
        return await self.reads.read(handle, offset, size)

    def release(self, handle: ReadHandle) -> None:
        self.reads.release(handle)
