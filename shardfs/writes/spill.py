"""File contents held for writers: in memory while small, in an unlinked spill file beyond that.

A ``SpillBuffer`` is the content of a temporary file, or of a chunk file being
rewritten in place, until it is committed or removed. Up to ``threshold``
bytes (8 MiB by default) it is a ``bytearray``; the first write or truncate
that would take it past that moves it to a file in the spill directory (the
mount's state directory), created with ``O_TMPFILE`` (or unlinked right
after creation where the filesystem has no ``O_TMPFILE``), so no spill file
outlives the daemon, even after a SIGKILL. Holes stay holes: truncating to
100 GiB allocates nothing, and reads of a hole give zeros. ``clear`` gives
the space back at once.

The daemon's memory therefore holds at most ``threshold`` bytes per open
temporary or chunk file, whatever clients write. Methods that touch a spill
file block (page-cache I/O on a local disk): the writer runs them through
``trio.to_thread`` when the buffer is spilled (``spilled``).
"""

from __future__ import annotations

import errno
import os
import threading

SPILL_THRESHOLD = 8 << 20


class SpillBuffer:
    """A growable byte string that moves to an unlinked file once it exceeds ``threshold``.

    Thread-safe: writes, truncates and reads from worker threads are serialised by a lock,
    so ``size`` is always the size the last completed call left.
    """

    def __init__(self, spill_dir: str, threshold: int = SPILL_THRESHOLD, data: bytes = b"") -> None:
        self.spill_dir = spill_dir
        self.threshold = threshold
        self._mem: bytearray | None = bytearray(data)
        self._fd = -1
        self._size = len(data)
        self._lock = threading.Lock()
        if self._size > threshold:
            with self._lock:
                self._spill()

    @property
    def size(self) -> int:
        return self._size

    @property
    def spilled(self) -> bool:
        """True once the content lives in a spill file (calls then block on disk I/O)."""
        return self._fd >= 0

    def _spill(self) -> None:
        """Move the in-memory content to a new unlinked file (lock held)."""
        os.makedirs(self.spill_dir, mode=0o700, exist_ok=True)
        try:
            fd = os.open(self.spill_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            import tempfile

            fd, name = tempfile.mkstemp(dir=self.spill_dir, prefix="spill-")
            os.unlink(name)
        try:
            assert self._mem is not None  # not spilled yet
            view = memoryview(self._mem)
            pos = 0
            while pos < len(view):
                pos += os.pwrite(fd, view[pos:], pos)
            os.ftruncate(fd, self._size)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._mem = fd, None

    def write(self, offset: int, data: bytes | memoryview) -> int:
        """Write ``data`` at ``offset`` (a gap before it reads as zeros); returns ``len(data)``."""
        end = offset + len(data)
        with self._lock:
            if self._mem is not None and end > self.threshold:
                self._spill()
            if self._mem is not None:
                if offset > len(self._mem):
                    self._mem.extend(bytes(offset - len(self._mem)))
                self._mem[offset:end] = data
            else:
                view = memoryview(data)
                pos = 0
                while pos < len(view):
                    pos += os.pwrite(self._fd, view[pos:], offset + pos)
            self._size = max(self._size, end)
        return len(data)

    def truncate(self, size: int) -> None:
        """Make the content ``size`` bytes long (growing it with a hole of zeros)."""
        with self._lock:
            if self._mem is not None and size > self.threshold:
                self._spill()
            if self._mem is not None:
                if size < len(self._mem):
                    del self._mem[size:]
                else:
                    self._mem.extend(bytes(size - len(self._mem)))
            else:
                os.ftruncate(self._fd, size)
            self._size = size

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer at the end)."""
        with self._lock:
            size = max(0, min(size, self._size - offset))
            if size == 0:
                return b""
            if self._mem is not None:
                return bytes(self._mem[offset: offset + size])
            parts = []
            while size > 0:
                part = os.pread(self._fd, size, offset)
                if not part:
                    break
                parts.append(part)
                offset += len(part)
                size -= len(part)
            return b"".join(parts)

    def getvalue(self) -> bytes:
        """The whole content (callers bound ``size`` first: this is one allocation of it)."""
        return self.read(0, self._size)

    def clear(self) -> None:
        """Empty the content and give a spill file's space back (the buffer stays usable)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd, self._mem, self._size = -1, bytearray(), 0

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
