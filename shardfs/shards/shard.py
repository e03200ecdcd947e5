"""One shard file in the source: its cached index, where one inner chunk is in it, and
rewriting it with changed chunks (the fold).

Index tables are cached keyed by the shard's ``(key, Version)`` (inode, size,
mtime; ETag, size, last-modified for objects), so a shard replaced by anyone is re-read. Functions named ``*_sync``
block and run off the trio thread.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from typing import NamedTuple

import numpy as np

from shardfs.format.index import EMPTY, CorruptIndex, IndexFormat
from shardfs.base.lru import SizedLRU
from shardfs.format.shardfile import CORRUPT, ShardFormat, assemble, outermost, read_table
from shardfs.storage import ABSENT, Range, Storage, Version, VersionMismatch, Absent

log = logging.getLogger("shardfs")
INDEX_TRIES = 3  # reads of an index that find the shard replaced under them before EIO
DECODE_MANY_BYTES = 1 << 20  # index bytes ``read_indexes_sync`` decodes at once (at most)
RACES = 20  # a rewrite that finds the shard changed this many times in a row gives up (and is retried later)
_EMPTY, _CORRUPT = int(EMPTY), int(CORRUPT)


class CorruptShard(Exception):
    """A shard cannot be used; ``str()`` names the reason (the caller names the file)."""

    version: Version | None = None  # the shard's version found corrupt (the index cache keeps it)


class Extent(NamedTuple):
    """Where one stored inner chunk lives: a byte range of a shard of a given version."""

    key: str
    version: Version
    offset: int
    nbytes: int


INDEX_CACHE_BYTES = 64 << 20  # a mount's decoded index tables (N workers: each keeps its share)


class IndexCache(SizedLRU[tuple[str, Version], "np.ndarray | CorruptShard"]):
    """A bounded LRU of decoded index tables (and of failures, so a corrupt shard is logged once),
    which also knows the version of each key's newest entry (``latest``): a shard never read
    is read without asking its version first (that would be a request of its own)."""

    def __init__(self, max_bytes: int = INDEX_CACHE_BYTES) -> None:
        super().__init__(max_bytes, lambda item: item.nbytes if isinstance(item, np.ndarray) else 64)
        self._latest: dict[str, Version] = {}

    def get(self, key: str, version: Version) -> np.ndarray | CorruptShard | None:  # type: ignore[override]  # key and version apart
        return super().get((key, version))

    def put(self, key: str, version: Version, item: np.ndarray | CorruptShard) -> None:  # type: ignore[override]  # (base: one tuple)
        super().put((key, version), item)
        if len(self._latest) >= 65536:
            self._latest.clear()
        self._latest[key] = version

    def latest(self, key: str) -> Version | None:
        """The version of the newest entry put for ``key`` (it may have been evicted since)."""
        return self._latest.get(key)

    def forget(self, key: str) -> None:
        """``key`` was found changed: its next read starts from the index (``latest`` is None)."""
        self._latest.pop(key, None)


def read_index_sync(source: Storage, key: str, fmt: ShardFormat) -> tuple[Version, np.ndarray] | None:
    """Read and verify a shard's flat table (``shardfile``); None if the shard does not exist.

    One request for the shard's own index: a suffix read (a ranged one when the index is at
    the start) that also gives the version read (``Storage.read_versioned``: no version
    check before it). With nested sharding, one more ``Storage.read`` per level of inner
    shards, of all that level's indexes at once, conditioned on that version; a shard
    replaced meanwhile is read again from its index, at most ``INDEX_TRIES`` times. Raises
    ``CorruptShard`` (carrying the version) if the shard's own index is unusable; a corrupt
    inner shard is logged here, once, and only its chunks are marked corrupt.
    """
    index = outermost(fmt)
    for _ in range(INDEX_TRIES):
        found = _read_head(source, key, index)
        if found is None:
            return None
        head, version = found
        start = 0 if index.at_start else version.size - len(head)
        try:
            return version, _table(source, key, fmt, version, start, head)
        except VersionMismatch:
            source.changed(key)
            source.stats.retries += 1
            continue
    raise OSError(errno.EIO, f"changed during {INDEX_TRIES} reads of its index", source.describe(key))


def read_indexes_sync(source: Storage, keys: list[str], fmt: ShardFormat
                      ) -> list[tuple[Version, np.ndarray] | None | CorruptShard | OSError]:
    """``read_index_sync`` of each of ``keys`` in turn, in one call (one thread hop for many
    small shards); each one's result, or the ``CorruptShard`` or ``OSError`` (``Unusable``
    included) it raised. Indexes of one level are decoded all at once (``decode_many``)."""
    out: list[tuple[Version, np.ndarray] | None | CorruptShard | OSError] = []
    heads: dict[int, tuple[bytes, Version]] = {}  # position in ``out`` -> its index's bytes, read

    def decode() -> None:
        tables = fmt.decode_many([head for head, _ in heads.values()],  # type: ignore[union-attr]  # flat: see below
                                 [version.size for _, version in heads.values()])
        for (at, (_, version)), table in zip(heads.items(), tables):
            if isinstance(table, CorruptIndex):
                err = CorruptShard(str(table))
                err.version = version
                out[at] = err
            else:
                out[at] = version, table
        heads.clear()

    for key in keys:
        try:
            if not isinstance(fmt, IndexFormat):
                out.append(read_index_sync(source, key, fmt))
                continue
            found = _read_head(source, key, fmt)
            if found is not None and len(found[0]) != min(found[1].size, fmt.nbytes):  # changed meanwhile
                out.append(read_index_sync(source, key, fmt))
                continue
            out.append(None)
            if found is not None:
                heads[len(out) - 1] = found
                if len(heads) * fmt.nbytes >= DECODE_MANY_BYTES:
                    decode()
        except (CorruptShard, OSError) as e:
            out.append(e)
    if heads:
        decode()
    return out


def _read_head(source: Storage, key: str, index: IndexFormat) -> tuple[bytes, Version] | None:
    """The bytes of a shard's (outermost) index, or all of a shard shorter than it, and the
    version read; None if the shard does not exist."""
    first = Range(0, index.nbytes) if index.at_start else Range(-index.nbytes, index.nbytes)
    try:
        return source.read_versioned(key, first)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def table_of_whole(source: Storage, key: str, fmt: ShardFormat, version: Version, data: bytes | memoryview
                   ) -> np.ndarray:
    """The flat table of a shard fetched whole (``data``: all of ``version``), as
    ``read_index_sync`` gives it, without a request; ``CorruptShard`` as there."""
    return _table(source, key, fmt, version, 0, data)


def _table(source: Storage, key: str, fmt: ShardFormat, version: Version, start: int, head: bytes | memoryview
           ) -> np.ndarray:
    """``_decode_levels``, a corrupt inner shard logged once."""
    table, problems = _decode_levels(source, key, fmt, version, start, head)
    for pos, reason in problems.items():
        where = tuple(int(i) for i in np.unravel_index(pos, outermost(fmt).chunks_per_shard))
        log.error("%s: corrupt inner shard at %s of the shard's grid of inner shards: %s",
                  source.describe(key), where, reason)
    return table


class _NotRead(CorruptIndex):
    """An index byte range not fetched yet (``_decode_levels`` fetches it and decodes again)."""


def _decode_levels(source: Storage, key: str, fmt: ShardFormat, version: Version, start: int,
                   head: bytes | memoryview) -> tuple[np.ndarray, dict[int, str]]:
    """``read_table`` of the shard whose bytes from ``start`` are ``head``: decoded again after
    each level of inner indexes it asked for was fetched, all of that level in one read."""
    fetched: dict[Range, bytes] = {}

    def read(offset: int, n: int) -> bytes:
        if start <= offset and offset + n <= start + len(head):
            return bytes(head[offset - start: offset - start + n])  # (of a view: a copy, no reference to it)
        data = fetched.get(Range(offset, n))
        if data is None:
            missing.append(Range(offset, n))
            raise _NotRead(f"{n} bytes at {offset} not read yet")  # only that inner shard stops
        return data

    while True:
        missing: list[Range] = []
        problems: dict[int, str] = {}
        try:
            table = read_table(fmt, read, 0, version.size, problems)
        except CorruptIndex as e:
            if not missing:
                err = CorruptShard(str(e))
                err.version = version
                raise err from None
        if not missing:
            return table, problems
        fetched.update(zip(missing, source.read(key, missing, if_version=version)))


def extent(key: str, version: Version, table: np.ndarray, pos: int) -> Extent | None:
    """The extent of inner chunk ``pos`` of a shard, None if that chunk is empty.

    Raises ``CorruptShard`` if the chunk lies in a corrupt inner shard.
    """
    offset, nbytes = table.item(pos, 0), table.item(pos, 1)  # Python ints: no numpy scalars on the hot path
    if offset == _EMPTY:
        if nbytes == _CORRUPT:
            raise CorruptShard("the chunk's inner shard is corrupt")
        return None
    return Extent(key, version, offset, nbytes)


def has_corrupt(table: np.ndarray) -> bool:
    """True if some chunks of a flat table lie in a corrupt inner shard."""
    return bool(np.any(table[:, 1] == CORRUPT))


def rewrite_sync(source: Storage, key: str, fmt: ShardFormat | None,
                 changes: dict[int, bytes | None]) -> Version | None:
    """Apply ``changes`` (index position -> stored chunk bytes, None = empty it) to a shard.

    The shard is read, rebuilt (``shardfile.assemble``: Morton order, nested inner
    shards rebuilt) and replaced atomically only if it is still the version that was read
    (``Storage.replace``/``delete`` with ``if_version``): when another writer (another
    mount, tensorstore) changed it in between, it is read again and the changes applied on
    top of the new content. A shard left without chunks is deleted where the source deletes
    atomically (``Storage.atomic_delete``: a local directory); an object store has no
    conditional DELETE (a HEAD, then the DELETE: another host's fold landing between the two
    would be deleted with the shard), so there it becomes an empty shard (its index alone,
    every chunk empty, as zarr reads a missing shard), replaced conditionally like any
    fold, and a shard already empty is left as it is. Returns the new version, None if the
    shard was deleted. Raises ``CorruptShard`` if the existing shard or one of its inner
    shards is unusable, ``OSError`` if the source refuses (nothing is written).
    """
    for attempt in range(RACES):
        try:
            return _rewrite_once(source, key, fmt, changes)
        except VersionMismatch:
            log.debug("%s: changed by another writer while folding; reading it again", source.describe(key))
            source.stats.retries += 1
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise OSError(f"the shard changed under {RACES} rewrites in a row")


def _rewrite_once(source: Storage, key: str, fmt: ShardFormat | None,
                  changes: dict[int, bytes | None]) -> Version | None:
    if fmt is None:  # an unsharded chunk: the "shard" is the chunk itself (last writer wins)
        data = changes[0]
        if data is None:
            source.delete(key)
            return None
        return source.replace(key, [data])
    chunks: dict[int, bytes | memoryview] = {}
    version: Version | Absent
    try:
        old, version = source.read_all(key)
    except FileNotFoundError:
        old, version = b"", ABSENT
    if old:
        problems: dict[int, str] = {}
        try:
            table = read_table(fmt, lambda offset, n: old[offset: offset + n], 0, len(old), problems)
        except CorruptIndex as e:
            raise CorruptShard(str(e)) from None
        if problems:
            raise CorruptShard(f"{len(problems)} corrupt inner shards: {next(iter(problems.values()))}")
        view = memoryview(old)
        for stored in np.flatnonzero(table[:, 0] != EMPTY):
            start, n = int(table[stored, 0]), int(table[stored, 1])
            chunks[int(stored)] = view[start: start + n]
    stored_before = len(chunks)
    for pos, data in changes.items():
        if data is None:
            chunks.pop(pos, None)
        else:
            chunks[pos] = data
    if not chunks and (source.atomic_delete or version is ABSENT):
        source.delete(key, if_version=version)
        return None
    if not chunks and not stored_before and old:  # an empty shard already (no delete: see above)
        return version  # type: ignore[return-value]  # not ABSENT (``old`` was read)
    return source.replace(key, assemble(fmt, chunks), if_version=version)
