"""The tree room: what the mount shows, the filesystem the kernel adapter calls.

- ``nodes``: the node kinds (keys) and the presented groups and arrays;
- ``nodetable``: inode numbers <-> node keys;
- ``ledger``: the numbers given to the kernel, appended as given out, for a worker replacing a dead one;
- ``metadata``: a node's ``zarr.json`` parsed defensively;
- ``hierarchy``: ``Hierarchy``, the groups and arrays read from their ``zarr.json`` and described as v2;
- ``listing``: directory listings, paged;
- ``names``: ``Names``, name resolution, attributes, metadata files (and ``Resolved``: lookups kept
  for the opens that follow);
- ``opens``: ``Opens``, opens, reads and releases of the files the tree shows;
- ``numbers``: ``Numbers``, the numbers given to the kernel as a whole (compaction, follow, take-over);
- ``writer``: the ``Writer``: files opened for writing, staging files, rename/link/unlink;
- ``commits``: ``Commits``, chunk commits (validated, handed to the writeback, invalidated);
- ``structure``: ``Structure``: nodes made from ``.zarray``/``.zgroup``, metadata rewrites, mkdir, rmdir;
- ``made``: ``Made``, the structure made through the mount (new directories, unlinked metadata);
- ``chunks``: ``Chunks``, stored chunks merged with pending ones (extents, shards, chunk sets);
- ``tries``: ``Tries``, the one retry policy of an open (shared by ``Opens`` and the kernel adapter).

Imports ``reads``, ``writes``, ``shards``, ``storage`` and ``format``.
"""

__all__ = ["chunks", "commits", "hierarchy", "ledger", "listing", "made", "metadata", "names", "nodes", "nodetable",
           "numbers", "opens", "structure", "tries", "writer"]
