"""The writes room: what the mount keeps of written chunks until they are in their shards.

- ``journal``: the append-only, fsynced log of committed chunks, replayed at the next mount;
- ``writeback``: pending chunks per shard and the folds that rewrite shards with them;
- ``spill``: file contents held for writers, in memory while small, then in unlinked files.

Imports ``shards``, ``storage`` and ``format`` only.
"""

__all__ = ["journal", "spill", "writeback"]
