"""An asyncio event loop on its own thread, awaited from trio or from blocking code.

obstore's async API runs many requests concurrently on one Python thread (the I/O itself is on
obstore's tokio runtime); trio's worker threads would each hold one blocking request instead
(see ``shardfs.storage.objects`` for the measurement). ``LoopThread`` owns one asyncio loop
on a daemon thread: ``run(coro)`` blocks the calling thread until the coroutine is done,
``await trio_run(coro)`` suspends only the calling trio task. A cancelled trio task cancels its
coroutine (the request is abandoned; obstore drops it). Exceptions propagate unchanged.

Waking the loop never releases the GIL: asyncio wakes its loop from another thread by a
``send`` on its self-pipe, and ``socket.send`` releases the GIL, which the woken loop thread
takes at once, so the caller (the trio thread, starting a fetch in the middle of answering an
open) then waits to get it back: measured 0.6-2 ms per request started, 30-100 ms of the trio
thread blocked in a whole-array read through an S3 mount on a loaded 2-core machine. ``_Loop``
writes that byte with a libc ``write`` called with the GIL held (a non-blocking socket: never
waits), so the loop thread runs once the caller releases the GIL anyway (3-9 ms in all,
measured the same way).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
CLOSING = 1.0  # seconds ``close`` waits for the coroutines it cancels

_write = ctypes.PyDLL(None).write  # libc's write(2), called without releasing the GIL (PyDLL)
_write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
_write.restype = ctypes.c_ssize_t


class _Loop(asyncio.SelectorEventLoop):
    """asyncio's loop, woken from other threads without releasing the GIL (module docstring)."""

    def _write_to_self(self) -> None:
        # asyncio's own guards: no self-pipe once closed (fileno() is then -1: EBADF, ignored;
        # the GIL, held throughout, keeps another thread from closing it in between), a full
        # pipe (EAGAIN: the loop is being woken already) ignored.
        csock = self._csock  # type: ignore[attr-defined]  # asyncio's private self-pipe
        if csock is not None:
            _write(csock.fileno(), b"\0", 1)


class LoopThread:
    """One asyncio loop running on a daemon thread until ``close()``."""

    def __init__(self, name: str = "storage-loop"):
        self._loop = _Loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the future completes with its outcome. After ``close``,
        ``coro`` is closed and ``RuntimeError`` raised."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # (the loop is closed)
            coro.close()
            raise

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it is done (never call from the loop itself)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop")
        return self.submit(coro).result()

    async def trio_run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop; only the calling trio task waits for it."""
        import outcome
        import trio

        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        future = self.submit(coro)
        waiting = True

        def resume() -> None:  # on the trio thread
            nonlocal waiting
            if waiting:
                waiting = False
                trio.lowlevel.reschedule(task, outcome.capture(future.result))

        def done(_: concurrent.futures.Future) -> None:  # on the loop thread
            try:
                token.run_sync_soon(resume)
            except trio.RunFinishedError:
                pass

        future.add_done_callback(done)

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal waiting
            waiting = False
            future.cancel()
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def close(self) -> None:
        """Stop the loop, join its thread, and end every coroutine still pending with
        ``CancelledError`` (those only handed over too: none is left never awaited; those that
        do not end within ``CLOSING`` seconds are abandoned)."""
        loop = self._loop
        if self._thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join()
        if loop.is_closed():
            return
        loop.run_until_complete(self._cancel_pending())
        loop.close()

    @staticmethod
    async def _cancel_pending() -> None:
        await asyncio.sleep(0)  # (the coroutines handed over become tasks: ``submit``'s callbacks run)
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CLOSING)
