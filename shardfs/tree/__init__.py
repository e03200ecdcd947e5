"""The tree room: what the mount shows, the filesystem the kernel adapter calls.

- ``nodes``: the node kinds (keys) and the presented groups and arrays;
- ``nodetable``: inode numbers <-> node keys;
- ``metadata``: a node's ``zarr.json`` read and parsed defensively;
- ``listing``: directory listings, paged;
- ``view``: the ``View`` facade: hierarchy, name resolution, attributes, opens and reads;
- ``writer``: the ``Writer``: commits of chunk files, staging files, structure changes.

Imports ``reads``, ``writes``, ``shards``, ``storage`` and ``format``.
"""

__all__ = ["listing", "metadata", "nodes", "nodetable", "view", "writer"]
