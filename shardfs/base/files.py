"""Files on a local disk: ``fsync_dir`` (a rename or unlink in a directory made durable),
``not_regular`` (why a file of some mode is never opened for I/O, for log lines),
``socket_address`` (a unix socket's path however long) and ``PROBE`` (the name ``shardfs status``
looks up in a mount to learn whether its daemon answers)."""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
from typing import Iterator

SUN_PATH = 108  # bytes of a unix socket address's path on Linux, its NUL included
# the start of a name never asked before, looked up by ``shardfs status`` in a mount whose status
# socket is silent (``shardfs.app.mounts.unserved``); its ENOENT is no error of the mount's
PROBE = b".shardfs-probe-"

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


@contextlib.contextmanager
def socket_address(path: str) -> Iterator[str]:
    """What ``bind`` or ``connect`` takes for the unix socket at ``path``, while the block runs:
    ``path`` if it fits ``sun_path``, else ``/proc/self/fd/N/NAME`` through a descriptor of its
    directory (a state directory under a long home, or named after a long source, passes 107
    bytes: the bind or connect of ``path`` would fail with "AF_UNIX path too long").
    ``OSError`` if that directory cannot be opened."""
    if len(os.fsencode(path)) < SUN_PATH:
        yield path
        return
    fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)
