"""The kernel room: the pyfuse3 adapter between the kernel's requests and the tree.

- ``fuse_ops``: ``Operations``, syscalls -> ``View``/``Writer`` calls, errno mapping;
- ``inodes``: lookup counts and the kernel's page-cache state per inode;
- ``handles``: open file and directory handles;
- ``stats``: the FUSE requests answered, by operation and errno (``RequestStats``);
- ``fuseloop``: the request loop (pyfuse3's ``main`` with shardfs's own read lock).
"""

__all__ = ["fuse_ops", "fuseloop", "handles", "inodes", "stats"]
