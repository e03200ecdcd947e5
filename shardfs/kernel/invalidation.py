"""Dropping what the kernel caches of inodes whose content changed through the mount.

``Invalidation.invalidate`` is what a commit, a fold or a structure change calls
(``shardfs.tree.commits``, ``shardfs.tree.structure``): the kernel's cached pages and
attributes of the inodes it names, and of their aliases (``NodeTable.aliases``), are dropped,
for the inodes the kernel holds (``KernelInodes``).
"""

from __future__ import annotations

import pyfuse3
import trio

from shardfs.kernel.inodes import KernelInodes
from shardfs.tree.nodetable import NodeTable


class Invalidation:
    """Invalidations of one mount's inodes (``nodes``), as far as the kernel holds them (``kernel``)."""

    def __init__(self, kernel: KernelInodes, nodes: NodeTable, every: bool = False) -> None:
        """``every``: drop every inode named, held or not (``-o workers=N``: the lookups other
        workers answered are not counted in ``kernel``)."""
        self.kernel = kernel
        self.nodes = nodes
        self.every = every

    async def invalidate(self, inodes: list[int]) -> None:
        """Drop the kernel's cached pages and attributes of ``inodes`` (and of their aliases).

        Dentries are never invalidated: a reverse entry invalidation waits for the
        directory's lock, which a client's rename holds while it waits for this
        daemon, and if the daemon is killed in that window the mount wedges.
        Names therefore never change the inode they show (see ``NodeTable.drop_staging``).
        Inodes the kernel does not hold (never looked up, or forgotten) are skipped:
        it has nothing cached for them, and their next open finds no pages to keep
        (so nothing is remembered for them: written chunks the kernel evicted before
        their fold would otherwise pile up here).
        """
        shown = [alias for ino in inodes for alias in (ino, *self.nodes.aliases(ino))]
        for ino in shown:
            self.kernel.invalidated(ino)  # (remembered as changed if held: ``KernelInodes``)
        targets = shown if self.every else [ino for ino in shown if self.kernel.holds(ino)]
        if targets:
            await trio.to_thread.run_sync(invalidate_inodes, targets)


def invalidate_inodes(inodes: list[int], attr_only: bool = False) -> None:
    """``pyfuse3.invalidate_inode`` each (its attributes only if ``attr_only``); blocks while a
    client holds a page of one locked (never if ``attr_only``)."""
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino, attr_only)
        except OSError:
            pass  # the kernel does not know this inode
