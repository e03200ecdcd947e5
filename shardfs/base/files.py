"""Files on a local disk: ``fsync_dir`` (a rename or unlink in a directory made durable) and
``not_regular`` (why a file of some mode is never opened for I/O, for log lines)."""

from __future__ import annotations

import os
import stat as stat_mod

_KINDS = {stat_mod.S_IFDIR: "a directory", stat_mod.S_IFIFO: "a FIFO", stat_mod.S_IFSOCK: "a socket",
          stat_mod.S_IFCHR: "a character device", stat_mod.S_IFBLK: "a block device",
          stat_mod.S_IFLNK: "a symlink"}


def not_regular(mode: int) -> str:
    """Why a file of ``mode`` (not a regular file) is never opened for I/O, for log lines."""
    return f"not a regular file ({_KINDS.get(stat_mod.S_IFMT(mode), 'unknown type')})"


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename or unlink in it is durable (missing is fine)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
