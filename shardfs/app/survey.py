"""Which chunks of an array exist: every stored shard's index read and counted (``shardfs inspect``).

The stored shards are found by listing the array (``Storage.keys_below``: one request per
1000 keys on an object store), never by asking for each shard of the grid, so a sparse
100k-shard array costs what it stores. Their indexes are read ``CONCURRENCY`` at a time
in worker threads (each a ranged read of the index alone, ``shard.read_index_sync``), at most
``WINDOW`` in flight: memory holds the counts, one integer pair per stored shard, never the
indexes. ``progress`` is told of each shard read (a progress bar on a terminal).
"""

from __future__ import annotations

import concurrent.futures
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

import numpy as np

from shardfs.shards import shard as shard_mod
from shardfs.format.index import EMPTY
from shardfs.format.layout import ArrayLayout
from shardfs.format.shardfile import CORRUPT
from shardfs.storage import Storage
from shardfs.writes.writeback import chunks_in_shard

CONCURRENCY = 16  # index reads in flight at once
WINDOW = 4 * CONCURRENCY  # shards submitted and not yet counted
MAX_KEYS = 10_000_000  # keys an array's listing may hold

T = TypeVar("T")


@dataclass
class Survey:
    """Counts over an array's shard grid (see ``survey``)."""

    shard_grid: tuple[int, ...]
    chunks_per_shard: tuple[int, ...]
    chunk_grid: tuple[int, ...]  # inner chunks along each dimension inside the array
    chunks: dict[tuple[int, ...], int] = field(default_factory=dict)  # stored shard -> its stored chunks
    sizes: dict[tuple[int, ...], int] = field(default_factory=dict)  # stored shard -> its bytes
    chunk_bytes: int = 0  # bytes of the stored inner chunks (no index)
    corrupt: dict[tuple[int, ...], str] = field(default_factory=dict)  # shard -> why it cannot be read

    @property
    def shards_total(self) -> int:
        return math.prod(self.shard_grid)

    @property
    def chunks_total(self) -> int:
        """Inner chunks inside the array."""
        return math.prod(self.chunk_grid)

    def in_bounds(self, shard: tuple[int, ...]) -> int:
        """Inner chunks of ``shard`` that lie inside the array."""
        return chunks_in_shard(self.chunk_grid, self.chunks_per_shard, shard)


def stored_shards(storage: Storage, array: str, layout: ArrayLayout) -> list[tuple[tuple[int, ...], str]]:
    """``(shard coords, key)`` of every shard stored below ``array`` (keys that are not shards of
    the grid, such as ``zarr.json``, are left out), in key order."""
    keys = storage.keys_below(array, MAX_KEYS)
    if keys is None:
        raise ValueError(f"{storage.describe(array)}: more than {MAX_KEYS} keys")
    out = []
    for rel in keys:
        coords = layout.keys.parse(rel)
        if coords is not None and all(0 <= c < g for c, g in zip(coords, layout.shard_grid)):
            out.append((coords, f"{array}/{rel}" if array else rel))
    return out


def survey(storage: Storage, layout: ArrayLayout, shards: list[tuple[tuple[int, ...], str]],
           progress: Callable[[int], None] | None = None) -> Survey:
    """Count the inner chunks stored in ``shards`` (``stored_shards`` of an array of ``layout``);
    ``progress(n)`` after ``n`` more shards were read. A shard whose index cannot be used is
    counted in ``corrupt`` with the reason (its chunks are not counted)."""
    out = Survey(layout.shard_grid, layout.chunks_per_shard, layout.chunk_grid)
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="survey") as pool:
        for coords, result in _bounded(pool, shards, lambda key: _count(storage, key, layout)):
            if isinstance(result, str):
                out.corrupt[coords] = result
            elif result is not None:
                out.chunks[coords], nbytes, out.sizes[coords] = result
                out.chunk_bytes += nbytes
            if progress is not None:
                progress(1)
    return out


def _bounded(pool: concurrent.futures.Executor, shards: list[tuple[tuple[int, ...], str]],
             fn: Callable[[str], T]) -> Iterator[tuple[tuple[int, ...], T]]:
    """``(coords, fn(key))`` for each shard, at most ``WINDOW`` submitted and not yet yielded."""
    pending: dict[concurrent.futures.Future, tuple[int, ...]] = {}
    todo = iter(shards)
    while True:
        for coords, key in todo:
            pending[pool.submit(fn, key)] = coords
            if len(pending) >= WINDOW:
                break
        if not pending:
            return
        done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            yield pending.pop(future), future.result()


def _count(storage: Storage, key: str, layout: ArrayLayout) -> tuple[int, int, int] | str | None:
    """``(stored chunks, their bytes, shard bytes)`` of the shard at ``key``; the reason if it
    cannot be read; None if it is gone."""
    if layout.index is None:  # unsharded: the key is one chunk
        try:
            version = storage.version(key)
        except OSError as e:
            return e.strerror or str(e)
        return None if version is None else (1, version.size, version.size)
    try:
        found = shard_mod.read_index_sync(storage, key, layout.index)
    except shard_mod.CorruptShard as e:
        return f"corrupt: {e}"
    except OSError as e:
        return e.strerror or str(e)
    if found is None:
        return None
    version, table = found
    stored = (table[:, 0] != EMPTY) & (table[:, 1] != CORRUPT)
    if not stored.all() and np.any(table[:, 1] == CORRUPT):
        return "corrupt: an inner shard's index"
    return int(stored.sum()), int(table[stored, 1].sum()), version.size
