"""What the kernel holds of the mount's inodes, as far as the daemon must track it.

The inode numbers, the node each one shows and the aliases of committed staging
files belong to ``View`` (``View.node_key``, ``View.aliases``, ``View.forget``).
This module keeps the kernel's side of the table: how many lookups of each inode
it holds (an inode it does not hold has nothing cached, so needs no invalidation,
and once it holds none the view may free it), and the version of each file whose
pages it may have cached, so an open can tell it whether to keep them.
"""

from __future__ import annotations

from shardfs.view import Attr


class KernelInodes:
    """Lookup counts and page-cache versions of the inodes the kernel knows."""

    def __init__(self) -> None:
        self._lookups: dict[int, int] = {}  # inode -> lookups the kernel holds (until it forgets them)
        self._cached: dict[int, tuple[int, int]] = {}  # inode -> (size, mtime) of the version last opened

    def looked_up(self, ino: int) -> None:
        """The kernel got an entry for ``ino`` (lookup, create, link, readdirplus): one more lookup."""
        self._lookups[ino] = self._lookups.get(ino, 0) + 1

    def forget(self, ino: int, n: int) -> bool:
        """The kernel dropped ``n`` lookups of ``ino``; True if it holds none any more."""
        left = self._lookups.pop(ino, 0) - n
        if left > 0:
            self._lookups[ino] = left
            return False
        return True

    def holds(self, ino: int) -> bool:
        """True while the kernel holds a lookup of ``ino`` (and so may cache its attributes or pages)."""
        return ino in self._lookups

    def keep_cache(self, attr: Attr) -> bool:
        """A file is being opened at version ``attr``: True if the pages the kernel cached are of
        that version (it may keep them). Remembers the version for the next open."""
        version = (attr.size, attr.mtime_ns)
        same = self._cached.get(attr.ino) == version
        self._cached[attr.ino] = version
        return same

    def changed(self, ino: int) -> None:
        """The content of ``ino`` changed: the next open must not keep its cached pages."""
        self._cached.pop(ino, None)
