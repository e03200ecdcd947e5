"""Decoded chunk files (crc32c-stripped or transcoded), kept across opens within a byte budget.

Entries are keyed by the ``Extent`` they were decoded from, which names the
shard's version (inode, size, mtime): a shard replaced by a fold or by
anyone else gets new extents, so a stale chunk is never served.
"""

from __future__ import annotations

import logging

from shardfs.config import ReadConfig
from shardfs.base.lru import SizedLRU
from shardfs.shards.shard import Extent

DEFAULT_BYTES = ReadConfig.chunk_cache  # -o chunk_cache
log = logging.getLogger("shardfs")


class ChunkCache:
    """An LRU of chunk-file bytes by ``Extent``, bounded by ``max_bytes`` (0 disables it)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self._lru: SizedLRU[Extent, bytes] = SizedLRU(max_bytes, len)

    @property
    def lru(self) -> SizedLRU[Extent, bytes]:
        """The LRU itself: its hits, misses, bytes used and limit (``shardfs status``)."""
        return self._lru

    def get(self, ext: Extent) -> bytes | None:
        data = self._lru.get(ext)
        if data is not None:
            log.debug("%s: chunk at %d served from the chunk cache", ext.key, ext.offset)
        return data

    def decoded(self, ext: Extent, data: bytes) -> None:
        """Record that ``data`` was decoded from ``ext``, and keep it if it fits the budget."""
        log.debug("%s: chunk at %d decoded (chunk cache: %d entries, %d of %d bytes)", ext.key, ext.offset,
                  len(self._lru), self._lru.used, self._lru.max_bytes)
        if len(data) <= self._lru.max_bytes:
            self._lru.put(ext, data)

