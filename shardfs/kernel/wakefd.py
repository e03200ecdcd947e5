"""The eventfd that wakes a mount's parked workers (``-o workers=auto``: ``shardfs.kernel.elastic``):
the supervisor makes it and writes it when a worker ends; the first worker writes it when
requests queue up. Apart from ``elastic``, so that the supervisor imports no trio."""

from __future__ import annotations

import os


def wake_fd() -> int:
    """The eventfd of a mount's parked workers (the supervisor's; given to each worker)."""
    return os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def wake(fd: int) -> None:
    """Have every parked worker of ``fd`` serve (until it finds the queue calm again)."""
    try:
        os.eventfd_write(fd, 1)
    except BlockingIOError:  # (the counter is full: it is readable already)
        pass
