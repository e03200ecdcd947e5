"""pyfuse3's request loop with a cheaper lock around its wait for the next request, and a wait
that skips trio's scheduler while requests are already queued.

``pyfuse3.main()`` runs request tasks that take turns at one ``trio.Lock`` while they wait for
``/dev/fuse`` to become readable (trio lets one task at a time wait on a file descriptor).
``trio.Lock`` makes every acquisition a checkpoint (a pass through trio's scheduler, with an
``epoll_wait``) and hands the lock over first come, first served, so with two request tasks
(pyfuse3 starts a second one at the first request) they alternate: the one that read a request
hands the lock to the other, which must run to start waiting.

``main()`` runs ``pyfuse3.main()`` with two changes, in a copy of the ``trio`` module that only
pyfuse3 sees (trio itself, and every other ``trio.Lock``, stay as they are):

- :class:`ReadLock` as its read lock: taken without a checkpoint when free, and not handed over.
  A release wakes nobody; whenever a task step ends with the lock free and a task waiting for it,
  one waiter is woken (a trio instrument). The task that answered a request without suspending
  takes the lock straight back, so one task serves a sequential client alone and the other stays
  parked; a task whose handler suspends (a thread, a network request) leaves the lock free at the
  end of that step, so the other task is woken and reads the next requests while the handler
  waits, as with ``trio.Lock``.
- :class:`QueuedWait` as ``trio.lowlevel.wait_readable``: when a request is already queued
  (a ``poll`` with no timeout says so), it returns at once, without a pass through trio's
  scheduler (``epoll_ctl`` + ``epoll_wait`` + the run loop), at most ``STREAK`` times in a row;
  then, and whenever nothing is queued, it waits through trio, so other tasks (threads'
  results, timers, the other request task) run at least every ``STREAK`` requests.

Measured on a writable mount (zarr 2.18 reading 3072 chunk files, 2-core VM, medians of
alternated runs): daemon CPU per chunk 215 -> 195 us with one reader, 211 -> 156 us with four.
Imports only the standard library, pyfuse3 and trio (``scripts/bench_lib/floorfs.py`` uses it).
"""

from __future__ import annotations

import select
import types
from typing import Any

import pyfuse3
import trio

STREAK = 8  # requests answered in a row without a pass through trio's scheduler, at most


class ReadLock(trio.abc.Instrument):
    """An async lock without checkpoint or hand-over (see the module's docstring). Contract: an
    ``async with`` block holds it alone; a release wakes nobody, but whenever a task step ends
    with the lock free and a task waiting for it, one waiter is woken (waiters re-check, so none
    is left parked while the lock is free and the run goes on)."""

    def __init__(self) -> None:
        self._held = False
        self._waiters = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        while self._held:
            trio.lowlevel.add_instrument(self)  # once per run (trio ignores a second add)
            await self._waiters.park()
        self._held = True

    async def __aexit__(self, *exc: Any) -> None:
        self._held = False

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        """A task ran as far as it could: if the lock is free now, its holder suspended
        outside it (or ended), so a waiter takes over."""
        if not self._held and self._waiters:
            self._waiters.unpark()


class QueuedWait:
    """``wait_readable(fd)`` for one file descriptor at a time, without a checkpoint while it is
    already readable, at most ``STREAK`` times in a row (see the module's docstring)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fd = -1
        self._streak = 0

    async def wait_readable(self, fd: int) -> None:
        if self._streak < STREAK:
            if fd != self._fd:
                if self._fd >= 0:
                    self._poll.unregister(self._fd)
                self._poll.register(fd, select.POLLIN)
                self._fd = fd
            if self._poll.poll(0):  # readable, or an error (unmounted): the read says which
                self._streak += 1
                return
        self._streak = 0
        await trio.lowlevel.wait_readable(fd)


def _trio_for_pyfuse3() -> types.ModuleType:
    """A copy of the ``trio`` module whose ``Lock`` is :class:`ReadLock` and whose
    ``lowlevel.wait_readable`` is :class:`QueuedWait`'s."""
    shim = types.ModuleType(trio.__name__, trio.__doc__)
    shim.__dict__.update(trio.__dict__)
    shim.Lock = ReadLock  # type: ignore[attr-defined]
    lowlevel = types.ModuleType(trio.lowlevel.__name__, trio.lowlevel.__doc__)
    lowlevel.__dict__.update(trio.lowlevel.__dict__)
    lowlevel.wait_readable = QueuedWait().wait_readable  # type: ignore[attr-defined]
    shim.lowlevel = lowlevel  # type: ignore[attr-defined]
    return shim


async def main() -> None:
    """``pyfuse3.main()`` (default task counts) with :class:`ReadLock` as its read lock and
    :class:`QueuedWait` as its wait for the next request."""
    if pyfuse3.trio is trio:  # type: ignore[attr-defined]
        pyfuse3.trio = _trio_for_pyfuse3()  # type: ignore[attr-defined]
    await pyfuse3.main()
