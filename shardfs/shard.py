"""One shard file: its cached index, and reading one inner chunk out of it.

Index tables are cached keyed by the shard's ``(key, Version)`` (inode, size,
mtime), so a shard replaced by anyone is re-read. Functions named ``*_sync``
block and run off the trio thread.
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from shardfs.index import EMPTY, CorruptIndex, IndexFormat, empty_table, morton_order
from shardfs.source import Source, Version


class CorruptShard(Exception):
    """A shard cannot be used; ``str()`` names the reason (the caller names the file)."""


@dataclass(frozen=True)
class Extent:
    """Where one stored inner chunk lives: a byte range of a shard of a given version."""

    key: str
    version: Version
    offset: int
    nbytes: int


class IndexCache:
    """A bounded LRU of decoded index tables (and of failures, so a corrupt shard is logged once)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._max = max_bytes
        self._used = 0
        self._items: OrderedDict[tuple[str, Version], np.ndarray | CorruptShard] = OrderedDict()

    def get(self, key: str, version: Version) -> np.ndarray | CorruptShard | None:
        item = self._items.get((key, version))
        if item is not None:
            self._items.move_to_end((key, version))
        return item

    def put(self, key: str, version: Version, item: np.ndarray | CorruptShard) -> None:
        size = item.nbytes if isinstance(item, np.ndarray) else 64
        old = self._items.pop((key, version), None)
        if old is not None:
            self._used -= old.nbytes if isinstance(old, np.ndarray) else 64
        self._items[(key, version)] = item
        self._used += size
        while self._used > self._max and len(self._items) > 1:
            _, dropped = self._items.popitem(last=False)
            self._used -= dropped.nbytes if isinstance(dropped, np.ndarray) else 64


def read_index_sync(source: Source, key: str, fmt: IndexFormat) -> tuple[Version, np.ndarray] | None:
    """Read and verify a shard's index with one ranged read; None if the shard does not exist.

    Raises ``CorruptShard`` (carrying the version) if the index is unusable.
    """
    try:
        fd, version = source.open(key)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        offset, length = fmt.index_range(version.size)
        raw = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    try:
        return version, fmt.decode(raw, version.size)
    except CorruptIndex as e:
        err = CorruptShard(str(e))
        err.version = version  # type: ignore[attr-defined]
        raise err from None


def extent(key: str, version: Version, table: np.ndarray, pos: int) -> Extent | None:
    """The extent of inner chunk ``pos`` of a shard, None if that chunk is empty."""
    offset, nbytes = table[pos]
    if offset == EMPTY:
        return None
    return Extent(key, version, int(offset), int(nbytes))


def open_extent_sync(source: Source, ext: Extent) -> int | None:
    """Open the shard holding ``ext``; None if it was replaced since ``ext`` was resolved."""
    try:
        fd, version = source.open(ext.key)
    except FileNotFoundError:
        return None
    if version != ext.version:
        os.close(fd)
        return None
    return fd


@functools.lru_cache(maxsize=64)
def _order(chunks_per_shard: tuple[int, ...]) -> np.ndarray:
    return morton_order(chunks_per_shard)


def rewrite_sync(source: Source, key: str, fmt: IndexFormat | None,
                 changes: dict[int, bytes | None]) -> Version | None:
    """Apply ``changes`` (index position -> stored chunk bytes, None = empty it) to a shard.

    The shard is rebuilt with its inner chunks in Morton order and replaced
    atomically (``Source.replace``); a shard left without chunks is deleted.
    Returns the new version, None if the shard was deleted. Raises
    ``CorruptShard`` if the existing shard's index is unusable (nothing is written).
    """
    if fmt is None:  # an unsharded chunk: the "shard" is the chunk itself
        data = changes[0]
        if data is None:
            source.remove(key)
            return None
        return source.replace(key, [data])
    chunks: dict[int, bytes | memoryview] = {}
    try:
        with open(source.path(key), "rb") as f:
            old = f.read()
    except FileNotFoundError:
        old = b""
    if old:
        offset, length = fmt.index_range(len(old))
        try:
            table = fmt.decode(old[offset: offset + length], len(old))
        except CorruptIndex as e:
            raise CorruptShard(str(e)) from None
        view = memoryview(old)
        for pos in np.flatnonzero(table[:, 0] != EMPTY):
            start, n = int(table[pos, 0]), int(table[pos, 1])
            chunks[int(pos)] = view[start: start + n]
    for pos, data in changes.items():
        if data is None:
            chunks.pop(pos, None)
        else:
            chunks[pos] = data
    if not chunks:
        source.remove(key)
        return None
    table = empty_table(fmt.n_chunks)
    parts: list[bytes | memoryview] = []
    offset = fmt.nbytes if fmt.at_start else 0
    for pos in _order(fmt.chunks_per_shard):
        data = chunks.get(int(pos))
        if data is not None:
            table[pos] = (offset, len(data))
            parts.append(data)
            offset += len(data)
    index = fmt.encode(table)
    return source.replace(key, [index, *parts] if fmt.at_start else [*parts, index])
