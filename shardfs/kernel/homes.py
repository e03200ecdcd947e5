"""Which worker of a read-only mount of a remote source serves a chunk's lookups and opens.

Each worker of ``-o workers=N`` fetches, caches and reads ahead for itself: a chunk file opened
through one worker and its neighbour through another cost a shard's GET in each, and neither
worker's read-ahead saw the sweep whole (measured in doc/BENCHMARKING.md: 4.7 GETs a shard at two
workers instead of 1). So every shard has a *home*: the worker of slot ``linear % N``, where
``linear`` is the shard's index in C order of the array's shard grid. The LOOKUP, GETATTR and
OPEN of a chunk file go to its shard's home (``shardfs.kernel.route``), and so its READs and
RELEASE (they follow the handle's opener); its read-ahead fetches the shards homed there alone
(``Prefetch.share``). Each shard is then fetched and cached by one worker, and the shards of a
sweep are spread over the workers in turn. A request whose chunk this worker cannot tell
without I/O (its array not read here yet) is served where it arrives: it is correct anywhere.

A round trip to the home costs more CPU than serving the chunk (doc/BENCHMARKING.md), so a
worker serves a chunk of another's shard itself where that needs no request to the store: the
home keeps each shard it fetched whole where every worker finds it
(``shardfs.storage.sharedshards``); a worker that finds it there learns its index from it, and
serves the LOOKUP and GETATTR (its index known here), and the OPEN (its bytes there too).

Local directories are served where requests arrive (a forward costs more than a read of the
kernel's pages), and so are writable mounts (their owner's routing: ``shardfs.kernel.owner``).
"""

from __future__ import annotations

import os
from typing import Any

from shardfs.format.layout import c_linear
from shardfs.kernel.owner import WRITE_FLAGS
from shardfs.reads.objects import ObjectReads
from shardfs.reads.prefetch import home_of
from shardfs.shards.indexes import ShardIndexes
from shardfs.tree.names import Names
from shardfs.tree.nodes import ArrayNode, ChunkKey, Unbound
from shardfs.tree.nodetable import NodeTable

ROUTED = frozenset(("lookup", "getattr", "open"))


class Homes:
    """The homes of chunk requests of a mount served by ``count`` workers, to worker ``slot``,
    which reads through ``reads`` and keeps indexes in ``indexes`` (module docstring)."""

    def __init__(self, names: Names, nodes: NodeTable, slot: int, count: int, indexes: ShardIndexes,
                 reads: ObjectReads) -> None:
        self.names, self.nodes, self.slot, self.count = names, nodes, slot, count
        self.indexes, self.reads = indexes, reads

    def of(self, op: str, args: tuple[Any, ...]) -> int | None:
        """The slot that must serve ``op(*args)``, or None if this worker may (not a chunk's
        request, an open for writing, a chunk this worker cannot tell without I/O, one homed
        here, or one it serves with no request to the store: ``_here``)."""
        if op not in ROUTED:
            return None
        try:
            if op == "lookup":
                found = self.names.loaded_chunk_at_name(args[0], os.fsdecode(args[1]))
            else:
                if op == "open" and args[1] & WRITE_FLAGS:
                    return None
                key = self.nodes.node_key(args[0])
                found = (key.arr, key.coords) if isinstance(key, ChunkKey) else None
        except (OSError, KeyError, Unbound):  # (a number or an array not known or read here yet)
            return None
        if found is None:
            return None
        arr, coords = found
        layout = arr.shown.layout
        shard = layout.locate(coords)[0]
        home = home_of(c_linear(shard, layout.shard_grid), self.count)
        return None if home == self.slot or self._here(op, arr, shard) else home

    def _here(self, op: str, arr: ArrayNode, shard: tuple[int, ...]) -> bool:
        """Whether this worker serves ``op`` on a chunk of ``shard`` of ``arr`` with no request
        to the store: the shard's index known here, or learnt from the shard kept whole where
        every worker finds it (``ObjectReads.kept_index``); for an open, all of that version kept there."""
        key = self.indexes.shard_key(arr, shard)
        version = self.indexes.index_cache.latest(key)
        fmt = arr.shown.layout.index
        if version is None and fmt is not None:
            learnt = self.reads.kept_index(key, fmt)
            if learnt is None:
                return False
            version = learnt[0]
            self.indexes.index_cache.put(key, *learnt)
        return version is not None and (op != "open" or self.reads.holds(key, version))
