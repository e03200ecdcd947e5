"""The byte layout of one shard file, flat or with nested sharding, and nothing else.

A shard is described by a ``ShardFormat``: an ``IndexFormat`` (one index over
the shard's inner chunks) or a ``NestedFormat`` (an index over inner shards,
each itself a ``ShardFormat`` blob, optionally followed by a crc32c of it).
Either way the rest of shardfs sees one *flat table*: ``(offset, nbytes)``
rows, absolute in the shard file, in C order over the shard's grid of
innermost chunks (``chunks_per_shard``). Nothing here does I/O: reads go
through a ``read(offset, length)`` callback.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import crc32c
import numpy as np

from shardfs.format.index import EMPTY, MAX_INDEX_ENTRIES, CorruptIndex, IndexFormat, empty_table, morton_order

# A flat-table row (EMPTY, CORRUPT) marks a chunk whose inner shard is unusable.
CORRUPT = np.uint64(2**64 - 2)
Read = Callable[[int, int], bytes]


@dataclass(frozen=True)
class NestedFormat:
    """A shard whose inner chunks are inner shards (nested ``sharding_indexed``).

    ``outer`` indexes the inner shards; each stored inner shard has format
    ``inner`` and, with ``crc32c``, ends with a crc32c of its bytes (not
    verified on read: that would read the whole inner shard).
    """

    outer: IndexFormat
    inner: "ShardFormat"
    crc32c: bool

    def __post_init__(self) -> None:
        if self.n_chunks > MAX_INDEX_ENTRIES:
            raise ValueError(f"{self.n_chunks} inner chunks per shard exceeds the supported {MAX_INDEX_ENTRIES}")

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        """The shard's grid of innermost chunks."""
        return tuple(a * b for a, b in zip(self.outer.chunks_per_shard, self.inner.chunks_per_shard))

    @property
    def n_chunks(self) -> int:
        return self.outer.n_chunks * self.inner.n_chunks


ShardFormat = IndexFormat | NestedFormat


@functools.lru_cache(maxsize=64)
def _order(chunks_per_shard: tuple[int, ...]) -> np.ndarray:
    return morton_order(chunks_per_shard)


@functools.lru_cache(maxsize=64)
def flat_positions(fmt: NestedFormat) -> np.ndarray:
    """``[outer pos, inner pos] -> flat pos``: where each inner shard's rows go in the flat table."""
    outer, inner = fmt.outer.chunks_per_shard, fmt.inner.chunks_per_shard
    if not outer:  # a 0-d array: one inner shard of one chunk
        return np.zeros((1, 1), dtype=np.int64)
    m = np.indices(outer).reshape(len(outer), -1, 1)  # inner-shard coords, outer C order
    r = np.indices(inner).reshape(len(inner), 1, -1)  # chunk coords in an inner shard, C order
    flat = np.zeros((m.shape[1], r.shape[2]), dtype=np.int64)
    for dim, n in enumerate(fmt.chunks_per_shard):
        flat = flat * n + (m[dim] * inner[dim] + r[dim])
    return flat


@dataclass
class Indexes:
    """The indexes of one shard (or inner shard) blob, each decoded once.

    ``table`` is the blob's own index, ``(n, 2)`` uint64 with offsets absolute in
    the shard file; with nested sharding ``inner`` maps each stored entry's position
    to that inner shard's ``Indexes``, or to the ``CorruptIndex`` that makes it unusable.
    """

    table: np.ndarray
    inner: dict[int, "Indexes | CorruptIndex"] = field(default_factory=dict)


def decode(fmt: ShardFormat, read: Read, base: int, size: int) -> Indexes:
    """Every index of the ``size``-byte shard that starts at byte ``base``.

    Raises ``CorruptIndex`` if the (outermost) index is unusable; an unusable inner
    shard is kept in ``Indexes.inner`` as its ``CorruptIndex``.
    """
    if isinstance(fmt, IndexFormat):
        offset, length = fmt.index_range(size)
        table = fmt.decode(read(base + offset, length), size)
        if base:
            table[table[:, 0] != EMPTY] += np.array([base, 0], dtype=np.uint64)
        return Indexes(table)
    outer = decode(fmt.outer, read, base, size)
    trailer = 4 if fmt.crc32c else 0
    for pos in np.flatnonzero(outer.table[:, 0] != EMPTY):
        offset, nbytes = int(outer.table[pos, 0]), int(outer.table[pos, 1]) - trailer
        try:
            if nbytes < 0:
                raise CorruptIndex(f"{nbytes + trailer} bytes cannot hold a crc32c")
            outer.inner[int(pos)] = decode(fmt.inner, read, offset, nbytes)
        except CorruptIndex as e:
            outer.inner[int(pos)] = e
    return outer


def flat_table(fmt: ShardFormat, indexes: Indexes) -> np.ndarray:
    """The flat table of a decoded shard: the chunks of an unusable inner shard are
    ``(EMPTY, CORRUPT)``."""
    if isinstance(fmt, IndexFormat):
        return indexes.table
    flat = empty_table(fmt.n_chunks)
    where = flat_positions(fmt)
    for pos, inner in indexes.inner.items():
        flat[where[pos]] = (EMPTY, CORRUPT) if isinstance(inner, CorruptIndex) else flat_table(fmt.inner, inner)
    return flat


def read_table(fmt: ShardFormat, read: Read, base: int, size: int,
               problems: dict[int, str] | None = None) -> np.ndarray:
    """The flat table of the ``size``-byte shard that starts at byte ``base``.

    Raises ``CorruptIndex`` if the (outermost) index is unusable. An unusable
    inner shard only marks its chunks ``(EMPTY, CORRUPT)`` and is reported in
    ``problems`` (its position in the outer index -> reason).
    """
    indexes = decode(fmt, read, base, size)
    if problems is not None:
        problems.update((pos, str(e)) for pos, e in indexes.inner.items() if isinstance(e, CorruptIndex))
    return flat_table(fmt, indexes)


def assemble(fmt: ShardFormat, chunks: dict[int, bytes | memoryview]) -> list[bytes | memoryview]:
    """The parts of a shard holding ``chunks`` (flat pos -> stored bytes), to be concatenated.

    Chunks (and inner shards) are laid out in Morton order, as zarr-python
    writes them; an inner shard without chunks is left out.
    """
    if isinstance(fmt, NestedFormat):
        where = flat_positions(fmt)
        blobs: dict[int, bytes | memoryview] = {}
        for pos in range(fmt.outer.n_chunks):
            inner = {i: chunks[int(p)] for i, p in enumerate(where[pos]) if int(p) in chunks}
            if inner:
                blob = b"".join(assemble(fmt.inner, inner))
                blobs[pos] = blob + crc32c.crc32c(blob).to_bytes(4, "little") if fmt.crc32c else blob
        return assemble(fmt.outer, blobs)
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
    return [index, *parts] if fmt.at_start else [*parts, index]


def outermost(fmt: ShardFormat) -> IndexFormat:
    """The index stored in the shard file itself."""
    return fmt.outer if isinstance(fmt, NestedFormat) else fmt
