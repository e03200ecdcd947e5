"""pyfuse3's request loop with a cheaper lock around its wait for the next request, and a wait
that skips trio's scheduler while requests are already queued or trio has nothing else to do.

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
  then it passes through trio (a checkpoint), so other tasks (threads' results, timers, the
  other request task) run at least every ``STREAK`` requests.
- When nothing is queued and trio has nothing else to do (no task scheduled, which
  :class:`Pending` sees through instrument hooks; no callback queued by a thread), that wait
  blocks in its own ``epoll`` on ``/dev/fuse`` and trio's epoll descriptor (readable as soon as
  trio has I/O to deliver: another descriptor a task waits on, a thread's result, a signal),
  until trio's next deadline: exactly what trio's own wait would block on, without its
  ``epoll_ctl``, run-loop pass and rescheduling. It returns at once if ``/dev/fuse`` alone is
  readable (a request), and otherwise passes through trio, which delivers the rest, and waits
  again. This is the case of every request of a serial client, which sends the next request
  only once the last is answered, so the request is never queued yet when the loop looks.
- That ``epoll`` watches ``/dev/fuse`` with ``EPOLLEXCLUSIVE``, and the request loop never
  waits for it in trio's own epoll (level-triggered, not exclusive): with ``-o workers=N`` the
  N workers' clones of one connection share its wait queue, and the kernel wakes one idle
  worker for a request instead of every one (the others would find nothing: ``EAGAIN``).

Measured on a writable mount (zarr 2.18 reading 3072 chunk files, 2-core VM, medians of
alternated runs): daemon CPU per chunk 215 -> 195 us with one reader, 211 -> 156 us with four
(queued requests); 345 -> 290 us with one reader (the blocking wait, on a slower VM).
- With ``-o workers=auto``, a worker past the first looks for requests only while the queue is
  busy (``shardfs.kernel.elastic``): :class:`QueuedWait` tells its gate whether each one was
  queued already.

Imports only the standard library, pyfuse3, trio and ``shardfs.kernel.elastic`` (itself only
those; ``scripts/bench_lib/floorfs.py`` uses this module).
"""

from __future__ import annotations

import math
import select
import types
from typing import Any

import pyfuse3
import trio

from shardfs.kernel.elastic import Gate

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


class Pending(trio.abc.Instrument):
    """The tasks trio has scheduled and not run yet (its run queue, and the rest of the batch of
    tasks it is running), seen through instrument hooks. Contract: once :meth:`watch` returned,
    :meth:`others` is True whenever a task other than the one running is scheduled to run."""

    def __init__(self) -> None:
        self._scheduled: set[trio.lowlevel.Task] = set()

    async def watch(self) -> None:
        """Add the hooks. A task scheduled before is not seen until it runs: two checkpoints
        let each of them run once (the rest of the current batch, then the run queue)."""
        trio.lowlevel.add_instrument(self)
        await trio.lowlevel.cancel_shielded_checkpoint()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self._scheduled.add(task)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._scheduled.discard(task)

    def others(self) -> bool:
        """True if a task is scheduled to run (the running one never is)."""
        return bool(self._scheduled)


def trio_epoll() -> int:
    """The file descriptor of the running trio's epoll instance, or -1 if this trio keeps none
    where this module looks (then :class:`QueuedWait` never blocks in its own ``poll``)."""
    runner = getattr(trio._core._run.GLOBAL_RUN_CONTEXT, "runner", None)
    epoll = getattr(getattr(runner, "io_manager", None), "_epoll", None)
    return epoll.fileno() if isinstance(epoll, select.epoll) else -1


class QueuedWait:
    """``wait_readable(fd)`` for one file descriptor at a time, without a checkpoint while it is
    already readable, or while trio has nothing else to do (with ``pending``) until it is, at
    most ``STREAK`` times in a row (see the module's docstring). Contract: returns once ``fd``
    is readable (or in error); trio's scheduled tasks, I/O and deadlines wait for no request."""

    def __init__(self, pending: Pending | None = None, gate: Gate | None = None, exclusive: bool = True) -> None:
        """``pending``: the :class:`Pending` watching this run; without it, a wait for a request
        not queued yet always goes through trio. ``gate``: this worker's of ``-o workers=auto``
        (``shardfs.kernel.elastic``), told of each look for a request, which it may delay.
        ``exclusive``: False (the tests' ``SHARDFS_TEST_WAKE_ALL``) wakes this worker for every
        request, so that the N workers race for each one (``_watch``)."""
        self._queued = select.poll()  # fd
        self._idle = select.epoll()  # fd (exclusive: see ``_watch``) and trio's epoll descriptor
        self._fd = -1
        self._trio_fd = -1
        self._streak = 0
        self._pending = pending
        self._gate = gate
        self._closing: set[int] = set()  # descriptors ``notify_closing`` named
        self._wake = select.EPOLLIN | (select.EPOLLEXCLUSIVE if exclusive else 0)

    def notify_closing(self, fd: int) -> None:
        """``trio.lowlevel.notify_closing(fd)``, which also ends a wait of this one for ``fd``
        (``ClosedResourceError``): pyfuse3's ``terminate()`` ends its loop so (a SIGTERM: the
        daemon folds and ends), and this wait is not in trio's epoll, where trio's own looks."""
        self._closing.add(fd)
        trio.lowlevel.notify_closing(fd)
        if self._gate is not None:
            self._gate.close()

    def _watch(self, fd: int) -> None:
        if self._fd >= 0:
            self._queued.unregister(self._fd)
            self._idle.unregister(self._fd)
        self._queued.register(fd, select.POLLIN)
        # exclusive: of the processes blocked in an epoll of this kind on one device file (the N
        # workers' clones of a connection share its wait queue), the kernel wakes one for a
        # request, not every one (the others would find nothing: EAGAIN): the first of them to
        # have registered, so a serial client is served by one worker (the others wake only
        # while it is busy)
        self._idle.register(fd, self._wake)
        self._fd = fd
        if self._pending is not None and self._trio_fd < 0:
            self._trio_fd = trio_epoll()
            if self._trio_fd < 0:
                self._pending = None
            else:
                self._idle.register(self._trio_fd, select.EPOLLIN)

    def _wait_idle(self) -> bool:
        """If trio has nothing to run, block until ``fd`` or trio's epoll descriptor is readable
        or trio's next deadline has come; True if ``fd`` alone is readable."""
        if self._pending is None or self._pending.others():
            return False
        stats = trio.lowlevel.current_statistics()
        t = stats.seconds_to_next_deadline
        if stats.run_sync_soon_queue_size or t <= 0:
            return False
        ready = self._idle.poll(-1 if t == math.inf else t)  # (whole milliseconds, rounded up)
        return len(ready) == 1 and ready[0][0] == self._fd

    async def wait_readable(self, fd: int) -> None:
        if fd in self._closing:
            raise trio.ClosedResourceError("another task closed this file descriptor")
        if fd != self._fd:
            self._watch(fd)
        queued = None  # the look's ``poll``, told to the gate and used again below
        if self._gate is not None:
            queued = bool(self._queued.poll(0))
            if await self._gate.turn(queued):  # (it waited: parked)
                queued = None
        if self._streak < STREAK:
            # readable, or an error (unmounted): the read says which
            if (self._queued.poll(0) if queued is None else queued) or self._wait_idle():
                self._streak += 1
                return
        self._streak = 0
        if self._pending is None:
            await trio.lowlevel.wait_readable(fd)
            return
        # Through trio's scheduler (its tasks, I/O and deadlines), but never waiting in trio's
        # own epoll for ``fd``: it would wake this worker for every request of the connection
        # (only ``_idle`` waits exclusively); the wait is then this process's own again.
        while True:
            await trio.lowlevel.checkpoint()
            if fd in self._closing:  # (``notify_closing`` ran meanwhile)
                raise trio.ClosedResourceError("another task closed this file descriptor")
            ready = self._queued.poll(0) or self._wait_idle()
            if ready:
                return


def _trio_for_pyfuse3(pending: Pending, gate: Gate | None, exclusive: bool) -> types.ModuleType:
    """A copy of the ``trio`` module whose ``Lock`` is :class:`ReadLock` and whose
    ``lowlevel.wait_readable`` and ``lowlevel.notify_closing`` are those of a
    :class:`QueuedWait` with ``pending``, ``gate`` and ``exclusive``."""
    shim = types.ModuleType(trio.__name__, trio.__doc__)
    shim.__dict__.update(trio.__dict__)
    shim.Lock = ReadLock  # type: ignore[attr-defined]  # a module object made at runtime
    lowlevel = types.ModuleType(trio.lowlevel.__name__, trio.lowlevel.__doc__)
    lowlevel.__dict__.update(trio.lowlevel.__dict__)
    wait = QueuedWait(pending, gate, exclusive)
    lowlevel.wait_readable = wait.wait_readable  # type: ignore[attr-defined]  # a module made at runtime
    lowlevel.notify_closing = wait.notify_closing  # type: ignore[attr-defined]  # a module made at runtime
    shim.lowlevel = lowlevel  # type: ignore[attr-defined]  # a module object made at runtime
    return shim


async def main(gate: Gate | None = None, exclusive: bool = True) -> None:
    """``pyfuse3.main()`` (default task counts) with :class:`ReadLock` as its read lock and
    :class:`QueuedWait` (with a :class:`Pending` watching this run, ``gate`` and ``exclusive``)
    as its wait for the next request; returns when the connection ends (unmounted or aborted)."""
    pending = Pending()
    await pending.watch()
    pyfuse3.trio = _trio_for_pyfuse3(pending, gate, exclusive)  # type: ignore[attr-defined]  # pyfuse3's own trio, replaced on purpose
    try:
        await pyfuse3.main()
    except* ConnectionAbortedError:
        # The end of the connection, as ENODEV (which ends pyfuse3's loop): the kernel gives
        # ECONNABORTED to a read of /dev/fuse once the connection is aborted, or when it ends (an
        # unmount) between taking a request off its queue and handing it over. The daemon then
        # ends as after any unmount (a writable mount folds what is pending).
        pass
    finally:
        trio.lowlevel.remove_instrument(pending)
