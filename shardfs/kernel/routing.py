"""Which worker serves a request of a writable mount with ``-o workers=N``: here, or the owner.

Contract: ``route(op, args)`` is called before a handler serves a request. On the owner
(no ``link``) it marks the area the request is about to change (``Areas.before``: before the
change, so before its acknowledgement; OSError: a change that cannot be marked is not made)
and returns ``LOCAL``. On another worker it returns ``LOCAL`` for what this worker may serve
itself, else the owner's answer (``OwnerLink.request``; ``FUSEError`` if it failed). A bug in
either is recorded in ``faults`` and answered EIO. ``forget`` gives the owner the lookups of a
FORGET this worker did not count (the owner's replies gave them to the kernel).

Which requests go to the owner: ``shardfs.kernel.owner``; how: ``shardfs.kernel.forward``.
"""

from __future__ import annotations

import errno
from typing import Any, Sequence

import pyfuse3

from shardfs.base.faults import Faults
from shardfs.kernel.forward import OwnerLink
from shardfs.kernel.inodes import KernelInodes
from shardfs.kernel.owner import Areas

LOCAL = object()  # ``route``'s answer for a request this worker serves itself


class Routing:
    """Where the requests of one worker of a writable mount's N go (the module docstring)."""

    def __init__(self, areas: Areas, link: OwnerLink | None, inodes: KernelInodes, faults: Faults) -> None:
        """``areas``: the marks of what was changed; ``link``: the connection to the owner (None:
        this worker is the owner); ``inodes``: the lookups this worker gave the kernel."""
        self.areas = areas
        self.link = link
        self._kernel = inodes
        self._faults = faults

    async def route(self, op: str, args: tuple[Any, ...]) -> Any:
        """``LOCAL``, or the owner's answer to request ``op`` (the module docstring)."""
        try:
            if self.link is None:
                self.areas.before(op, args)  # (OSError: a change that cannot be marked is not made)
            elif self.areas.forwards(op, args):
                return await self.link.request(op, args, self._kernel.looked_up)
        except pyfuse3.FUSEError:
            raise
        except Exception as e:
            self._faults.record(op, e, repr(args[:2]))
            raise pyfuse3.FUSEError(errno.EIO) from None
        return LOCAL

    def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """Send the owner what ``inode_list`` forgets beyond the lookups this worker counted."""
        if self.link is not None:  # the lookups the owner gave the kernel are its to forget
            self.link.send_forget([(ino, n - held) for ino, n in inode_list
                                   if (held := self._kernel.lookups(ino)) < n])

    def forwarded(self) -> dict[str, int]:
        """Requests forwarded to the owner, by operation (``shardfs status``: ``forwarded``)."""
        return {} if self.link is None else dict(self.link.forwarded)
