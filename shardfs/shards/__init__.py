"""The shards room: shard indexes read from storage and kept, and the fold rewrite.

- ``indexes``: ``ShardIndexes``, the mount's shard-index service (indexes read, checked and
  cached by version, one read per shard at a time; used by the view, the listings, the
  commits and the read-ahead);
- ``shard``: ``read_index_sync``/``read_indexes_sync`` (an index read and checked, nested levels
  decoded), ``IndexCache`` (indexes by shard version), ``extent`` (where an inner chunk lives),
  ``rewrite_sync`` (a shard rewritten with pending chunks, conditioned on its version).

Imports ``storage`` and ``format`` only.
"""

__all__ = ["indexes", "shard"]
