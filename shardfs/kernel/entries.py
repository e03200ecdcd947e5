"""What a reply shows of a node's attributes: pyfuse3 entry attributes.

An ``Attr`` (``shardfs.base.attrs``: inode, mode, size, mtime, links) becomes the entry the
kernel caches: the owner, group and permission bits every node of the mount shows (``-o
uid,gid,file_mode,dir_mode``: the kernel checks them, ``default_permissions``), the entry and
attribute timeouts (``-o entry_timeout,attr_timeout``), and the inode number's generation
(``KernelInodes.generation``: a directory removed and made again is another inode to the kernel).
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

import pyfuse3

from shardfs.base.attrs import Attr
from shardfs.config import KernelConfig
from shardfs.kernel.inodes import KernelInodes


def _modes(shown: KernelConfig, read_only: bool) -> tuple[int, int] | None:
    """(file, directory) permission bits of ``-o file_mode,dir_mode`` (writes bits cleared on a
    read-only mount); None if neither is given (the tree's own modes)."""
    if shown.file_mode is None and shown.dir_mode is None:
        return None
    ro = 0o222 if read_only else 0
    files = (0o444 if read_only else 0o644) if shown.file_mode is None else shown.file_mode
    dirs = (0o555 if read_only else 0o755) if shown.dir_mode is None else shown.dir_mode
    return files & ~ro, dirs & ~ro


def _remode(mode: int, modes: tuple[int, int]) -> int:
    """``mode`` with the permission bits of its kind from ``modes`` (files, directories)."""
    return stat.S_IFMT(mode) | (modes[1] if stat.S_ISDIR(mode) else modes[0])


class ReplyEntry(Protocol):
    """``Entries.entry``: an ``Attr`` as a reply shows it (filled into ``e`` if given)."""

    def __call__(self, attr: Attr, e: pyfuse3.EntryAttributes | None = None) -> pyfuse3.EntryAttributes: ...


class Entries:
    """The entries of one mount's replies (``kernel``: its slice of the configuration; ``inodes``:
    the generations)."""

    def __init__(self, kernel: KernelConfig, read_only: bool, inodes: KernelInodes) -> None:
        self.kernel = kernel
        self._inodes = inodes
        self._uid = os.getuid() if kernel.uid is None else kernel.uid
        self._gid = os.getgid() if kernel.gid is None else kernel.gid
        self._modes = _modes(kernel, read_only)

    def entry(self, attr: Attr, e: pyfuse3.EntryAttributes | None = None) -> pyfuse3.EntryAttributes:
        """``attr`` as pyfuse3 entry attributes (filled into ``e`` if given: readdir reuses one)."""
        if e is None:
            e = pyfuse3.EntryAttributes()
            e.st_blksize = 65536
            e.st_uid, e.st_gid = self._uid, self._gid
            e.entry_timeout = self.kernel.entry_timeout
            e.attr_timeout = self.kernel.attr_timeout
        e.st_ino = attr.ino
        e.generation = self._inodes.generation(attr.ino)
        e.st_mode = attr.mode if self._modes is None else _remode(attr.mode, self._modes)
        e.st_nlink = attr.nlink
        e.st_size = attr.size
        e.st_blocks = (attr.size + 511) // 512
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = attr.mtime_ns
        return e
