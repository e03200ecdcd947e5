"""Who asks: the mount's own user, or another one (``-o allow_other``; doc/SECURITY.md#allow-other).

The daemon reads and writes the source with its own rights, so a request of another user is
served only as far as the source lets that user:
- ``may_write(ctx)``: writes through the mount (open for writing, create, mkdir, unlink,
  rmdir, rename, link, truncate, chmod) are the mounting user's and root's only; another
  user's are EACCES (the daemon would otherwise write files that user may not write);
- ``may_read(source, names, inode, ctx)``: a file of a local source is opened for another user only if
  that user may read the source file it comes from (a chunk file: its shard; a metadata file:
  its ``zarr.json``; ``shardfs.storage.permits``), else EACCES. An object store or web source
  has no owners: the mount shows ``-o uid=,gid=,file_mode=,dir_mode=`` and the kernel checks
  them (``default_permissions``, always on).
"""

from __future__ import annotations

import errno
from typing import Any

import pyfuse3
import trio

from shardfs.storage.permits import may_read
from shardfs.storage import Storage
from shardfs.tree.names import Names


class Callers:
    """The mount's own user (``uid``); every other caller is checked."""

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def other(self, ctx: Any) -> bool:
        """True if ``ctx`` is a request of a user other than the mount's own and root."""
        return ctx is not None and ctx.uid not in (0, self.uid)

    def may_write(self, ctx: Any) -> None:
        """EACCES for a write of another user."""
        if self.other(ctx):
            raise pyfuse3.FUSEError(errno.EACCES)

    async def may_read(self, source: Storage, names: Names, inode: int, ctx: Any) -> None:
        """EACCES if another user may not read the file of ``source`` behind ``inode`` (``names``:
        ``Names.source_key``)."""
        if not self.other(ctx):
            return
        key = names.source_key(inode)
        path = None if key is None else source.owner_path(key)
        if path is None:
            return
        if not await trio.to_thread.run_sync(may_read, path, ctx.uid, _groups(ctx)):
            raise pyfuse3.FUSEError(errno.EACCES)


def _groups(ctx: Any) -> frozenset[int]:
    """The caller's group and supplementary groups (``/proc/PID/status``; its group alone if
    that cannot be read)."""
    groups = {ctx.gid}
    try:
        with open(f"/proc/{ctx.pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    groups.update(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError):
        pass
    return frozenset(groups)
