"""The format room: Zarr v3 sharded data and its Zarr v2 view, as pure functions (no I/O; ``bombs``
loads the system's libzstd once).

Data flows down only: ``app`` -> ``kernel`` -> ``tree`` -> ``reads`` -> ``writes`` -> ``shards``
-> ``storage`` -> ``format`` -> ``base``; this room imports none of the others.

- ``index``: shard index formats (checksummed tables of offset/length pairs) and their codecs;
- ``shardfile``: where a shard's index sits and how nested shards nest (``ShardFormat``);
- ``layout``: an array's grid, chunk keys and their v2 names (``ArrayLayout``);
- ``gridmap``: the character map and PNG of stored chunks (``shardfs inspect``);
- ``v2``: the v3 -> v2 mapping of one array (``ArrayInfo``, ``ChunkFormat``, ``CorruptChunk``);
- ``a2a``, ``draft``, ``dtypes``, ``fill``: codecs before sharding, the 2022 draft, data types,
  the v2 ``fill_value``;
- ``create``: the v3 ``zarr.json`` of an array or group created through the mount;
- ``printable``: text from the source or other users made safe to print or log;
- ``bombs``: how many bytes a compressed chunk decodes to, told before it is decoded.
"""

__all__ = ["a2a", "create", "draft", "dtypes", "fill", "gridmap", "index", "layout", "printable", "shardfile",
           "v2"]
