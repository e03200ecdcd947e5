"""The shards room: a shard's index read from storage and kept, and the fold rewrite.

``shard``: ``read_index_sync``/``read_indexes_sync`` (an index read and checked, nested levels
decoded), ``IndexCache`` (indexes by shard version), ``extent`` (where an inner chunk lives),
``rewrite_sync`` (a shard rewritten with pending chunks, conditioned on its version).
Imports ``storage`` and ``format`` only.
"""

__all__ = ["shard"]
