"""The kernel room: the pyfuse3 adapter between the kernel's requests and the tree.

- ``fuse_ops``: ``Operations``, syscalls -> calls on the tree (``Names``, ``Opens``, ``Listing``) and the
  ``Writer``, errno mapping;
- ``invalidation``: ``Invalidation``, dropping what the kernel caches of changed inodes;
- ``entries``: ``Entries``, a node's attributes as the entry a reply gives the kernel (owner, modes, timeouts);
- ``opening``: ``Opening``, an open for reading with the kernel's pages of its inode (dropped, or filled);
- ``inodes``: lookup counts and the kernel's page-cache state per inode;
- ``handles``: open file and directory handles;
- ``stats``: the FUSE requests answered, by operation and errno (``RequestStats``);
- ``fuseloop``: the request loop (pyfuse3's ``main`` with shardfs's own read lock).
"""

__all__ = ["entries", "fuse_ops", "fuseloop", "handles", "inodes", "invalidation", "opening", "stats"]
