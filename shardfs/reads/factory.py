"""``make_reads``: the read path for a source, the one it names (``Storage.read_path``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardfs.reads import Reads
from shardfs.reads.chunkcache import ChunkCache
from shardfs.storage import Storage

if TYPE_CHECKING:
    from shardfs.reads.rangecache import RangeCache
    from shardfs.storage.sharedshards import SharedShards


def make_reads(source: Storage, cache: RangeCache | None = None, chunk_cache: ChunkCache | None = None,
               shared: SharedShards | None = None) -> Reads:
    """The read path for ``source``, the one it names (``Storage.read_path``: ``"local"``, a
    ``pread`` at an extent; ``"objects"``, ranged GETs pinned to a version);
    ``cache``: where an object store's fetched ranges are kept (default:
    ``RangeCache(shardfs.reads.objects.DEFAULT_CACHE_BYTES)``, memory only); ``chunk_cache``:
    decoded chunks (default: ``ChunkCache()``); ``shared``: where N workers keep the shards of an
    object store fetched whole (``shardfs.storage.sharedshards``)."""
    chunk_cache = chunk_cache if chunk_cache is not None else ChunkCache()
    store: Any = source  # what its kind opens (``LocalStorage``; ``ObjectStorage``/``WebStorage``: ``requests``)
    if source.read_path == "local":
        from shardfs.reads.local import LocalReads

        return LocalReads(store, chunk_cache)
    from shardfs.reads.objects import ObjectReads

    return ObjectReads(store, store.requests, chunk_cache, cache, shared)
