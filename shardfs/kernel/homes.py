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

Local directories are served where requests arrive (a forward costs more than a read of the
kernel's pages), and so are writable mounts (their owner's routing: ``shardfs.kernel.owner``).
"""

from __future__ import annotations

import os
from typing import Any

from shardfs.format.layout import c_linear
from shardfs.kernel.owner import WRITE_FLAGS
from shardfs.reads.prefetch import home_of
from shardfs.tree.names import Names
from shardfs.tree.nodes import ArrayNode, ChunkKey, Unbound
from shardfs.tree.nodetable import NodeTable

ROUTED = frozenset(("lookup", "getattr", "open"))


class Homes:
    """The homes of chunk requests of a mount served by ``count`` workers (module docstring)."""

    def __init__(self, names: Names, nodes: NodeTable, count: int) -> None:
        self.names, self.nodes, self.count = names, nodes, count

    def of(self, op: str, args: tuple[Any, ...]) -> int | None:
        """The slot that must serve ``op(*args)``, or None if any may (not a chunk's request,
        an open for writing, or a chunk this worker cannot tell without I/O)."""
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
        return None if found is None else self._home(*found)

    def _home(self, arr: ArrayNode, coords: tuple[int, ...]) -> int:
        layout = arr.shown.layout
        return home_of(c_linear(layout.locate(coords)[0], layout.shard_grid), self.count)
