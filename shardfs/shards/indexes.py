"""``ShardIndexes``: the shard-index service of a mount: which shards exist, their indexes read,
checked and cached by version, one read per shard at a time.

Used by the view (lookups, opens), the listings, the commits (a write into a corrupt shard is
refused) and the object-store read-ahead (``shardfs.reads.prefetch``), all on the trio thread;
index reads go to worker threads. An array is anything with the ``Sharded`` attributes (the
tree's ``ArrayNode``). Errors are ``OSError`` with the errno for the client.
"""

from __future__ import annotations

import errno
import logging
import math
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

import numpy as np
import trio

from shardfs.format.layout import c_coords, c_linear
from shardfs.base.attrs import fail
from shardfs.storage.keys import join
from shardfs.shards import shard as shard_mod
from shardfs.shards.shard import CorruptShard, IndexCache
from shardfs.storage import UNKNOWN, Storage, Unusable, Version, Unknown
from shardfs.base.threads import blocking_read

if TYPE_CHECKING:
    from shardfs.format.v2 import ArrayInfo

log = logging.getLogger("shardfs")

INDEXES_PER_READ_BYTES = 1 << 20  # tables read in one call for a lookup (``per_read``), at most
INDEX_READS = 32  # shard indexes read at once (``read_indexes``, one shard per call)
SHARD_KEYS_KEPT = 4096  # shard keys remembered per array (formatting one costs more than a lookup)


class Sharded(Protocol):
    """What the index service needs of an array: where it is, its layout (``shown``: its
    ``ArrayInfo``, of an array shown as v2), the shard keys remembered for it."""

    @property
    def path(self) -> str: ...
    @property
    def shown(self) -> ArrayInfo: ...
    @property
    def shard_keys(self) -> dict[tuple[int, ...], str]: ...


def _versions_now(source: Storage, keys: list[str]) -> list[Version | None | Unknown]:
    """``source.version_now`` of each of ``keys`` (None for one that is unusable: its getattr
    meets the error again, remembered)."""
    out: list[Version | None | Unknown] = []
    for key in keys:
        try:
            out.append(source.version_now(key))
        except OSError:
            out.append(None)
    return out


class ShardIndexes:
    """The indexes of one source's shards. ``per_read``: shards whose never-read indexes a
    lookup reads in one call (``Reads.indexes_per_read``); ``version(key, ask)``: a key's
    version as the view asks it (an unusable key raises its errno, logged once);
    ``log_unusable(key, e)``: log once why ``key`` is not read; ``index_cache``: where the tables
    read are kept (shared with the read-ahead, which fills it too: ``shardfs.reads.prefetch``)."""

    def __init__(self, source: Storage, per_read: int,
                 version: Callable[..., Awaitable[Version | None | Unknown]],
                 log_unusable: Callable[[str, Unusable], None], index_cache: IndexCache | None = None) -> None:
        self.source = source
        self.per_read = per_read
        self.version = version
        self._log_unusable = log_unusable
        self.index_cache = IndexCache() if index_cache is None else index_cache
        self._index_reads: dict[str, trio.Event] = {}  # shard key -> its index being read

    def forget(self, key: str) -> None:
        """The shard at ``key`` was replaced since its index was read: read it again at its next use."""
        self.index_cache.forget(key)

    def reading(self, key: str) -> bool:
        """True while the index (or the whole shard) at ``key`` is being read."""
        return key in self._index_reads

    def begin(self, key: str) -> None:
        """A read of the shard at ``key`` begins elsewhere (a fetch ahead): ``shard_table``
        waits for it (``end``) as for its own read."""
        self._index_reads[key] = trio.Event()

    def end(self, key: str) -> None:
        """The read begun by ``begin`` ended (its index cached, or not)."""
        self._index_reads.pop(key).set()

    def shard_key(self, arr: Sharded, shard: tuple[int, ...]) -> str:
        """The source key of ``shard`` of ``arr`` (remembered: every lookup and open asks it)."""
        key = arr.shard_keys.get(shard)
        if key is None:
            if len(arr.shard_keys) >= SHARD_KEYS_KEPT:
                arr.shard_keys.clear()
            key = arr.shard_keys[shard] = join(arr.path, arr.shown.layout.keys.key(shard))
        return key

    async def shard_table(self, arr: Sharded, shard: tuple[int, ...], key: str = ""
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
        layout = arr.shown.layout
        with_next = self.per_read > 1
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
                result = await blocking_read(shard_mod.read_index_sync, self.source, key, layout.index)
            except (CorruptShard, Unusable) as e:
                result = e
            return self._index_read(key, result)
        finally:
            del self._index_reads[key]
            reading.set()

    async def _read_with_next(self, arr: Sharded, shard: tuple[int, ...]) -> None:
        """Read the index of never-read ``shard`` together with those of the shards after it in
        C order of the shard grid that were never read and are not being read, up to
        ``per_read`` shards in all (as far as their tables stay within
        ``INDEXES_PER_READ_BYTES``), in one worker thread call (``read_tables``): a client
        looking up or opening chunk files one at a time needs them next, and a thread hop per
        index costs more than reading a small one. Only the tables read are cached: a shard
        found corrupt, unusable or unreadable is left for its own ``shard_table`` to read
        (and log), so the client sees no error before it asks for that shard."""
        layout = arr.shown.layout
        grid = layout.shard_grid
        most = min(self.per_read, INDEXES_PER_READ_BYTES // (16 * math.prod(layout.chunks_per_shard)))
        at = c_linear(shard, grid)
        shards = [shard]
        for nxt in range(at + 1, min(at + most, math.prod(grid))):
            coords = c_coords(nxt, grid)
            key = self.shard_key(arr, coords)
            if self.index_cache.latest(key) is None and key not in self._index_reads:
                shards.append(coords)
        await self.read_tables(arr, shards, failures=False)

    async def read_tables(self, arr: Sharded, shards: list[tuple[int, ...]], failures: bool = True) -> None:
        """Read the indexes of those of ``shards`` never read and not being read, in one worker
        thread call (``read_indexes_sync``: one thread hop, and no version asked first, for many
        small shards), and cache them as ``shard_table`` does (a corrupt or unusable shard is
        logged; with ``failures`` False neither cached nor logged); other errors are left for
        ``shard_table`` to meet again. Returns when those being read by others were read too."""
        layout = arr.shown.layout
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
            results = await blocking_read(shard_mod.read_indexes_sync, self.source, keys, layout.index) if keys else []
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

    async def shard_versions(self, arr: Sharded, shards: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Ask the versions of ``shards`` the source answers at once (``version_now``: a local
        stat each, remembered for the getattrs that follow) in one worker thread call; those
        only a request would tell (objects not remembered) are returned."""
        keys = [self.shard_key(arr, shard) for shard in shards]
        found = await blocking_read(_versions_now, self.source, keys)
        return [shard for shard, version in zip(shards, found) if version is UNKNOWN]

    def _index_read(self, key: str, result: tuple[Version, np.ndarray] | None | CorruptShard | Unusable
                    ) -> tuple[Version, np.ndarray] | None:
        """What a read of ``key``'s index found, cached (a corrupt shard too, logged once per
        version; an unusable one logged once per reason, then raised as its errno)."""
        if isinstance(result, CorruptShard):
            log.error("%s: corrupt shard: %s", self.source.describe(key), result)
            if result.version is not None:  # set by every index read
                self.index_cache.put(key, result.version, result)
            raise fail(errno.EIO)
        if isinstance(result, Unusable):
            self._log_unusable(key, result)
            raise fail(result.errno, result.strerror)
        if result is not None:
            self.index_cache.put(key, *result)
        return result

    async def read_indexes(self, arr: Sharded, shards: list[tuple[int, ...]], at_once: int = INDEX_READS,
                           per_call: int = 1) -> None:
        """Read the indexes of ``shards`` that are not cached, ``at_once`` calls at a time (a
        listing needs them all; over an object store each is a round trip): with ``per_call``
        1 each through ``shard_table``, else ``per_call`` never-read ones in one worker thread
        call (``read_tables``: a thread hop per shard costs more than reading a small local
        shard's index). Errors are left for the caller's own ``shard_table`` to meet."""
        limiter = trio.CapacityLimiter(at_once)

        async def one(group: list[tuple[int, ...]]) -> None:
            async with limiter:
                try:
                    if per_call == 1:
                        await self.shard_table(arr, group[0])
                    else:
                        await self.read_tables(arr, group)
                except OSError:
                    pass

        async with trio.open_nursery() as nursery:
            for at in range(0, len(shards), per_call):
                nursery.start_soon(one, shards[at:at + per_call])
