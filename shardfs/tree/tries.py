"""The one retry policy of an open for reading: ``Tries``, the tries one open of a file gets,
shared by everything that may try it again.

Two things make an open try again: ``Opens`` finds the shard replaced between its index read
and the open (``Opens.open``: the chunk is looked up again), and the kernel adapter finds that
the file changed while the open ran (``Operations.open``: opened again, so the kernel is not
told a size the file no longer has). Both draw on the same ``Tries``, so one open costs at most
``OPEN_TRIES`` opens in all, whichever made them fail. When they run out, ``Opens`` answers EIO
(logged: a shard that keeps changing), the adapter keeps its last open and reads it with direct
I/O.
"""

from __future__ import annotations

OPEN_TRIES = 3  # opens of one file, before ``Opens`` gives up (EIO) or the adapter reads the last one direct


class Tries:
    """The tries left to one open (``OPEN_TRIES`` unless told)."""

    __slots__ = ("total", "left")

    def __init__(self, total: int = OPEN_TRIES) -> None:
        self.total, self.left = total, total

    def take(self) -> bool:
        """Take one try: False (and none taken) if none is left."""
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    @property
    def spent(self) -> bool:
        """No try is left."""
        return self.left <= 0
