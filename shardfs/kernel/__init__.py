"""The kernel room: the pyfuse3 adapter between the kernel's requests and the tree.

- ``fuse_ops``: ``Operations``, syscalls -> calls on the tree (``Names``, ``Opens``, ``Listing``) and the
  ``Writer``, errno mapping;
- ``attributes``: ``Attributes``, what a GETATTR answers;
- ``directories``: ``Directories``, open directories and their listings (READDIR, forwarded or not);
- ``invalidation``: ``Invalidation``, dropping what the kernel caches of changed inodes;
- ``entries``: ``Entries``, a node's attributes as the entry a reply gives the kernel (owner, modes, timeouts);
- ``opening``: ``Opening``, an open for reading with the kernel's pages of its inode (dropped, or filled);
- ``inodes``: lookup counts and the kernel's page-cache state per inode;
- ``handles``: open file and directory handles;
- ``pins``: the size an inode keeps while files opened on it read an older version;
- ``reopen``: handles a dead or another worker opened, opened again here at their first use;
- ``stats``: the FUSE requests answered, by operation and errno (``RequestStats``);
- ``callers``: who asks, under ``-o allow_other``;
- ``fuseloop``: the request loop (pyfuse3's ``main`` with shardfs's own read lock);
- with ``-o workers=N``: ``route`` (which worker serves a request), ``owner`` (what the owner worker of
  a writable mount serves), ``forward`` (requests between workers), ``homes`` (the worker that
  fetches a remote source's shard), ``pagetable`` and ``sharedpages`` (the kernel's page cache
  per inode, as every worker of the mount sees it), ``elastic`` (with ``-o workers=auto``: the
  workers past the first read the connection only while requests queue up; ``wakefd``, the eventfd
  that wakes them, which the supervisor makes without importing trio).

The public face (``__all__``): what other rooms import (``shardfs.app`` builds the adapter and the
workers' parts), and what the tests drive directly.
"""

__all__ = ["elastic", "entries", "forward", "fuse_ops", "fuseloop", "handles", "homes", "inodes", "invalidation",
           "opening", "owner", "pagetable", "route", "sharedpages", "stats", "wakefd"]
