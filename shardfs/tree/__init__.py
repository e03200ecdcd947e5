"""The tree room: what the mount shows, the filesystem the kernel adapter calls.

- ``nodes``: the node kinds (keys) and the presented groups and arrays;
- ``nodetable``: inode numbers <-> node keys;
- ``ledger``: the numbers given to the kernel, appended as given out, for a worker replacing a dead one;
- ``metadata``: a node's ``zarr.json`` parsed defensively;
- ``hierarchy``: ``Hierarchy``, the groups and arrays read from their ``zarr.json`` and described as v2;
- ``listing``: directory listings, paged;
- ``view``: the ``View`` facade the kernel adapter calls: name resolution, attributes, metadata
  files, opens and reads;
- ``writer``: the ``Writer``: commits of chunk files, staging files, rename/link/unlink;
- ``structure``: ``Structure``: nodes made from ``.zarray``/``.zgroup``, metadata rewrites, mkdir, rmdir;
- ``made``: ``Made``, the structure made through the mount (new directories, unlinked metadata);
- ``chunks``: ``Chunks``, stored chunks merged with pending ones (extents, shards, chunk sets);
- ``tries``: ``Tries``, the one retry policy of an open (shared by the view and the kernel adapter).

Imports ``reads``, ``writes``, ``shards``, ``storage`` and ``format``.
"""

__all__ = ["chunks", "hierarchy", "ledger", "listing", "made", "metadata", "nodes", "nodetable", "structure", "tries",
           "view", "writer"]
