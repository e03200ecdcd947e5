"""The binary shard index of the ``sharding_indexed`` codec, and nothing else.

An index is a uint64 array of shape ``chunks_per_shard + (2,)`` holding
``(offset, nbytes)`` per inner chunk in C order; ``(2**64-1, 2**64-1)`` marks an
empty inner chunk. On disk it is encoded by the index codecs: a ``bytes`` codec
(little or big endian), optionally followed by ``crc32c`` (4 bytes, little
endian, over the encoded pairs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import crc32c
import numpy as np

EMPTY = np.uint64(2**64 - 1)
MAX_INDEX_ENTRIES = 1 << 24  # 16M inner chunks per shard = a 256 MiB index


class CorruptIndex(ValueError):
    """The bytes are not a valid index for this shard (reason in the message)."""


@dataclass(frozen=True)
class IndexFormat:
    """How an index is encoded: its grid, byte order, checksum and location."""

    chunks_per_shard: tuple[int, ...]
    big_endian: bool = False
    checksum: bool = True
    at_start: bool = False

    def __post_init__(self) -> None:
        n = 1
        for c in self.chunks_per_shard:
            n *= c
        if n > MAX_INDEX_ENTRIES:
            raise ValueError(
                f"{n} inner chunks per shard exceeds the supported {MAX_INDEX_ENTRIES}"
            )

    @cached_property
    def n_chunks(self) -> int:
        return int(np.prod(self.chunks_per_shard, dtype=np.int64))

    @cached_property
    def nbytes(self) -> int:
        """Encoded size of the index in bytes."""
        return 16 * self.n_chunks + (4 if self.checksum else 0)

    @property
    def _dtype(self) -> np.dtype:
        return np.dtype(">u8" if self.big_endian else "<u8")

    def decode(self, raw: bytes, file_size: int) -> np.ndarray:
        """Decode ``raw`` (exactly ``nbytes`` long) into a native ``(n, 2)`` uint64 array.

        Verifies the checksum and that every non-empty entry lies inside the
        ``file_size``-byte shard outside the index itself; raises
        ``CorruptIndex`` with the reason otherwise.
        """
        found = self.decode_many([raw], [file_size])[0]
        if isinstance(found, CorruptIndex):
            raise found
        return found

    def decode_many(self, raws: list[bytes], file_sizes: list[int]) -> list[np.ndarray | CorruptIndex]:
        """``decode`` of the indexes of many shards at once (column-wise: a listing of many
        small shards costs numpy calls per call, not per shard): each one's table, or the
        ``CorruptIndex`` it would raise."""
        out: list[np.ndarray | CorruptIndex] = []
        good: list[int] = []
        body_len = 16 * self.n_chunks
        for raw, file_size in zip(raws, file_sizes):
            if len(raw) != self.nbytes:
                out.append(CorruptIndex(f"shard is {file_size} bytes, shorter than its {self.nbytes}-byte index"))
                continue
            if self.checksum:
                stored = int.from_bytes(raw[-4:], "little")
                actual = crc32c.crc32c(raw[:body_len])
                if stored != actual:
                    out.append(CorruptIndex(
                        f"index checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"))
                    continue
            good.append(len(out))
            out.append(CorruptIndex(""))  # replaced below
        if not good:
            return out
        tables = np.frombuffer(b"".join(raws[i][:body_len] for i in good), dtype=self._dtype
                               ).astype(np.uint64).reshape(len(good), -1, 2)
        offsets, lengths = tables[:, :, 0], tables[:, :, 1]
        empty = (offsets == EMPTY) & (lengths == EMPTY)
        sizes = np.array([file_sizes[i] for i in good], dtype=np.uint64)[:, None]
        data_start = self.nbytes if self.at_start else 0
        data_end = sizes if self.at_start else sizes - np.uint64(self.nbytes)
        bad = ~empty & (
            (offsets < data_start)
            | (lengths > data_end)
            | (offsets > data_end - np.minimum(lengths, data_end))
        )
        flawed = bad.any(axis=1).tolist()
        for j, i in enumerate(good):
            if flawed[j]:
                at = int(np.flatnonzero(bad[j])[0])
                out[i] = CorruptIndex(
                    f"index entry {at} (offset {int(offsets[j, at])}, nbytes {int(lengths[j, at])}) "
                    f"points outside the shard's data [{data_start}, {int(data_end[j, 0])})"
                )
            else:  # copies (astype): writable, and empty rows are already EMPTY
                out[i] = tables[j] if len(good) == 1 else tables[j].copy()
        return out

    def encode(self, table: np.ndarray) -> bytes:
        """Encode a ``(n, 2)`` uint64 table (``EMPTY`` rows for empty chunks)."""
        body = np.ascontiguousarray(table, dtype=self._dtype).tobytes()
        if self.checksum:
            body += crc32c.crc32c(body).to_bytes(4, "little")
        return body

    def index_range(self, file_size: int) -> tuple[int, int]:
        """``(offset, length)`` of the index inside a shard of ``file_size`` bytes."""
        if file_size < self.nbytes:
            return 0, file_size
        return (0 if self.at_start else file_size - self.nbytes), self.nbytes


def empty_table(n: int) -> np.ndarray:
    """An index table with all ``n`` inner chunks empty."""
    return np.full((n, 2), EMPTY, dtype=np.uint64)


def morton_order(chunks_per_shard: tuple[int, ...]) -> np.ndarray:
    """C-order linear indices of a shard's inner chunks, sorted in Morton (Z) order.

    This is the order zarr-python 3 writes inner chunks in; shardfs uses it for
    every shard it writes so layouts are reproducible.
    """
    if not chunks_per_shard:  # a 0-d array: one chunk
        return np.zeros(1, dtype=np.intp)
    grid = np.indices(chunks_per_shard).reshape(len(chunks_per_shard), -1).T
    bits = max(1, int(max(chunks_per_shard) - 1).bit_length())
    key = np.zeros(grid.shape[0], dtype=np.uint64)
    ndim = len(chunks_per_shard)
    for bit in range(bits):
        for dim in range(ndim):
            key |= ((grid[:, dim].astype(np.uint64) >> np.uint64(bit)) & np.uint64(1)) << np.uint64(
                bit * ndim + dim
            )
    return np.argsort(key, kind="stable")
