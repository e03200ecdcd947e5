"""The FUSE requests a mount answered, for ``shardfs status`` (``shardfs.app.status``): counted
by ``fuse_ops.Operations`` as ``shardfs.storage.stats`` counts store requests (a plain integer
increment where the event happens; see there why no lock is needed)."""

from __future__ import annotations

import errno
import time
from collections import deque
from typing import Any, TypedDict

import pyfuse3
import trio

from shardfs.base import files

RECENT_ERRORS = 256  # errors remembered with their time (``RequestStats.recent``)
ROUTINE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENOSYS, errno.ENODATA, errno.ESTALE})


def errno_name(code: int) -> str:
    """``ENOSPC`` for 28; ``E<n>`` for a number without a name."""
    return errno.errorcode.get(code, f"E{code}")


class Reads(TypedDict):
    chunk_files: int  # chunk files opened for reading
    bytes: int  # bytes answered to READs and stored into the page cache


class Requests(TypedDict):
    """The FUSE requests answered (``RequestStats.snapshot``): by operation, errors by errno
    name and operation, and what was read."""

    requests: dict[str, int]
    errors: dict[str, dict[str, int]]
    reads: Reads


class RequestStats:
    """FUSE requests by operation, their errors by (errno, operation), chunk files opened for
    reading and bytes read, since the mount began (kept by ``fuse_ops.Operations``)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.errors: dict[tuple[int, str], int] = {}
        self.chunk_files = 0
        self.read_bytes = 0
        # (monotonic time, errno, operation) of the last errors other than ``ROUTINE`` ones (a
        # lookup of a missing name is an answer, not a problem): what status shows as problems
        self.recent: deque[tuple[float, int, str]] = deque(maxlen=RECENT_ERRORS)
        self.waiting: trio.Event | None = None  # set at the next request (``next_request``)
        self.active = 0  # requests being answered here (counted, not forwarded): ``quiet`` waits for them
        # ``-o workers=auto``, the first worker (``shardfs.kernel.elastic``): requests begun here
        # (forwarded ones too) and the process (thread) of the last that names one
        self.counting = False
        self.arrivals = 0
        self.caller = 0

    def began(self, args: tuple[Any, ...]) -> None:
        """A request of ``args`` began (``fuse_ops._guard``, only while ``counting``)."""
        self.arrivals += 1
        if args and type(args[-1]) is pyfuse3.RequestContext:
            self.caller = args[-1].pid

    def arrived(self) -> None:
        """A request arrived (``fuse_ops._guard``, only while ``waiting``): what waits for it runs."""
        if self.waiting is not None:
            self.waiting.set()
            self.waiting = None

    async def next_request(self) -> None:
        """Wait until the next request arrives: the background loops of a worker of an idle mount
        (``-o workers=N``: following the ledger, publishing its status document) wait for it
        instead of waking on a timer (an idle mount then wakes no process at all)."""
        if self.waiting is None:
            self.waiting = trio.Event()
        await self.waiting.wait()

    def op(self, name: str) -> None:
        """Make ``name`` a known operation (so the per-request increment needs no default)."""
        self.requests.setdefault(name, 0)

    def error(self, code: int, op: str, args: tuple[Any, ...]) -> None:
        """Count an error ``code`` answered to ``op(*args)``; not the ENOENT of ``shardfs status``'s
        lookup of a name never asked before (``files.PROBE``: whether the daemon answers, asked of
        every mount of the user whose status socket is silent for a moment)."""
        if code == errno.ENOENT and op == "lookup" and args[1].startswith(files.PROBE):
            return
        key = (code, op)
        self.errors[key] = self.errors.get(key, 0) + 1
        if code not in ROUTINE:
            self.recent.append((time.monotonic(), code, op))

    def snapshot(self) -> Requests:
        errors: dict[str, dict[str, int]] = {}
        for (code, op), n in sorted(self.errors.items()):
            errors.setdefault(errno_name(code), {})[op] = n
        return {"requests": {op: n for op, n in sorted(self.requests.items()) if n},
                "errors": errors, "reads": {"chunk_files": self.chunk_files, "bytes": self.read_bytes}}

    def errors_since(self, seconds: float) -> dict[str, dict[str, int]]:
        """Errors (not ``ROUTINE``) of the last ``seconds``: ``{errno name: {operation: n}}``."""
        since = time.monotonic() - seconds
        out: dict[str, dict[str, int]] = {}
        for at, code, op in list(self.recent):
            if at >= since:
                by_op = out.setdefault(errno_name(code), {})
                by_op[op] = by_op.get(op, 0) + 1
        return out
