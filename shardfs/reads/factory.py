"""``make_reads``: the read path for a source, one implementation per kind of source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardfs.reads import Reads
from shardfs.reads.chunkcache import ChunkCache
from shardfs.storage import Storage

if TYPE_CHECKING:
    from shardfs.reads.rangecache import RangeCache


def make_reads(source: Storage, cache: RangeCache | None = None, chunk_cache: ChunkCache | None = None) -> Reads:
    """The read path for ``source`` (the one place above ``shardfs.storage`` that tells the kinds
    of source apart); ``cache``: where an object store's fetched ranges are kept (default:
    ``RangeCache(shardfs.reads.objects.DEFAULT_CACHE_BYTES)``, memory only); ``chunk_cache``:
    decoded chunks (default: ``ChunkCache()``)."""
    from shardfs.storage.local import LocalStorage

    chunk_cache = chunk_cache if chunk_cache is not None else ChunkCache()
    if isinstance(source, LocalStorage):
        from shardfs.reads.local import LocalReads

        return LocalReads(source, chunk_cache)
    from shardfs.reads.objects import ObjectReads

    return ObjectReads(source, chunk_cache, cache)  # type: ignore[arg-type]  # not local: an ObjectStorage
