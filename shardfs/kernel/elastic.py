"""The workers past the first serve only while requests queue up (``-o workers=auto``).

Of N workers reading one connection, the kernel wakes one for each request, in turn: a serial
client (one request at a time: a ``cat`` of chunk files, a zarr 2 reader) has its requests
served by each worker in turn, each woken for them, a request on a handle another worker opened
sent there; more CPU per request than one worker and nothing gained, since the next request
waits for this one's answer anyway. Several workers pay off only while requests wait in the
queue (several readers, the kernel's read-ahead).

So the first worker (slot 0) serves always and watches the queue: a look for the next request
is *deep* when it finds one queued, as did its look before. That alone is no proof of several
clients: a serial client's next request is queued whenever the worker still works after its
answer (``--debug`` logging each request), and the kernel's releases and forgets come in bursts
after its caches were dropped. So when at least ``BUSY`` of the looks of each window of ``WINDOW``
have been deep, and the window's requests came from two callers (threads) or more, for
``BUSY_S`` seconds, it wakes the others (an eventfd the supervisor makes, ``SHARDFS_WAKE_FD``,
made readable: ``shardfs.kernel.wakefd``). A woken worker serves for ``SERVE_S`` seconds, then
parks again (stops reading the connection; it still answers the other workers' forwarded
requests), emptying the eventfd: the first worker, alone again, wakes it at once if the queue
is still busy. The supervisor makes the eventfd readable too when a worker ends: the parked
workers serve while its slot starts again (the first's may be the one), or find the connection
ended (an unmount) and end.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import trio

from shardfs.kernel.wakefd import wake

WINDOW = 32  # requests of the first worker judged at a time
BUSY = 0.5  # ... found deep (the module docstring), at least, and
BUSY_S = 0.05  # ... with two callers or more, for this long (not a burst): they are woken
SERVE_S = 1.0  # seconds a woken worker serves, then parks (and is woken again while busy)


class Requests(Protocol):
    """A worker's count of the requests it began (``shardfs.kernel.stats.RequestStats``)."""

    counting: bool  # set: count ``arrivals`` and ``caller`` (only the first worker's gate needs them)
    arrivals: int  # requests begun
    caller: int  # the process (thread) of the last that names one (0: none yet)

    def arrived(self) -> None:
        """What waits for the worker's next request runs now."""


class Gate:
    """Whether a worker reads the connection now. Contract: :meth:`turn` is awaited before each
    look for the next request, told whether one was queued; it returns at once in the first
    worker (which may wake the others) and in a woken one, and waits while a parked one is
    (until woken, or ``close``)."""

    def __init__(self, index: int, fd: int, requests: Requests) -> None:
        """``index``: the worker's slot; ``fd``: the mount's eventfd (``wakefd.wake_fd``); ``requests``:
        the worker's count of requests (a look that found none, another worker having read it
        first, is not counted) and the caller of the last, told when this worker parks (its
        ``arrived``: the worker's status document is written again, ``shardfs.app.status``)."""
        self.first = index == 0
        self._requests = requests
        requests.counting = self.first
        self._arrived = 0  # ``requests.arrivals`` at the last look
        self._callers: set[int] = set()  # the callers of this window's requests
        self._last = False  # the last look found a request queued
        self.fd = fd
        self.parked = not self.first  # a new worker past the first waits to be woken
        self._waiting = False
        self._seen = 0  # the first worker's looks for a request counted in this window
        self._deep = 0  # ... that found a request queued, as did the look before
        self._before = False  # the counted look before the last found one queued
        self._since = time.monotonic()  # a helper's last wake
        self._busy_since: float | None = None  # the first worker's windows are busy since
        self._judged = 0.0  # when its last window was judged

    async def turn(self, queued: bool) -> bool:
        """Count this look (``queued``: a request was waiting already) and wake or park; True if
        it waited (parked: the queue is another now)."""
        if self.first:
            requests = self._requests
            if requests.arrivals != self._arrived:  # the last look found a request
                self._arrived = requests.arrivals
                self._callers.add(requests.caller)
                self._seen += 1
                self._deep += self._last and self._before
                self._before = self._last
            self._last = queued
            if self._seen >= WINDOW:
                now = time.monotonic()
                if self._deep < BUSY * self._seen or len(self._callers - {0}) < 2:
                    self._busy_since = None
                elif self._busy_since is None or now - self._judged > BUSY_S:
                    self._busy_since = now  # (a busy spell begins, also after a pause of the requests)
                elif now - self._busy_since >= BUSY_S:
                    wake(self.fd)
                self._judged = now
                self._seen = self._deep = 0
                self._callers.clear()
        elif not self.parked and time.monotonic() - self._since >= SERVE_S:
            self._park()
        if not self.parked:
            return False
        self._waiting = True
        try:
            await trio.lowlevel.wait_readable(self.fd)
        finally:
            self._waiting = False
        self.parked = False
        self._since = time.monotonic()
        return True

    def _park(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        self.parked = True
        self._requests.arrived()

    def close(self) -> None:
        """End a parked wait (``trio.ClosedResourceError``): the connection's loop ends."""
        if self._waiting:
            trio.lowlevel.notify_closing(self.fd)
