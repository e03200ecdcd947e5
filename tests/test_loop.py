"""shardfs.storage.loop: the asyncio loop thread that object-store requests run on, awaited from trio."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
import trio

from shardfs.storage.loop import LoopThread


@pytest.fixture
def loop():
    lt = LoopThread(name="test-loop")
    yield lt
    lt.close()


def test_trio_run_returns_raises_and_a_cancelled_task_cancels_its_coroutine(loop):
    cancelled = threading.Event()

    async def double(x: int) -> int:
        await asyncio.sleep(0.01)
        return 2 * x

    async def fail() -> None:
        raise KeyError("k")

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main() -> None:
        assert await loop.trio_run(double(21)) == 42
        with pytest.raises(KeyError, match="k"):
            await loop.trio_run(fail())
        with trio.move_on_after(0.05) as scope:
            await loop.trio_run(forever())
        assert scope.cancelled_caught

    trio.run(main)
    assert cancelled.wait(5)
    assert loop.run(double(5)) == 10


def test_waking_the_loop_never_releases_the_gil(loop):
    """A thread waiting for the GIL gets it whenever its holder releases it. While 10000 requests
    are handed to the loop, such a thread never runs: the wake-ups (a byte on the loop's
    self-pipe each) keep the GIL. With asyncio's own ``socket.send`` it runs.

    Deterministic under load: the waiting thread sleeps 10 µs between its steps (so it never
    holds the GIL long and is almost always waiting for it), and the switch interval is 30 s,
    so the interpreter cannot force the GIL over to it while this thread submits, however long
    the OS deschedules this process (the 10000 submits take tens of milliseconds)."""

    async def nothing() -> None:
        return None

    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1
            time.sleep(1e-5)  # releases the GIL, then waits for it again

    old = sys.getswitchinterval()
    spinner = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(30.0)
    try:
        spinner.start()
        while count[0] < 10:  # the spinner is running: from now on it waits for the GIL
            time.sleep(0.001)
        before = count[0]
        futures = [loop.submit(nothing()) for _ in range(10000)]
        ran = count[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(old)
        spinner.join()
    assert [f.result(timeout=10) for f in futures] == [None] * 10000
    assert ran == 0, f"the other thread ran {ran} steps while the loop was woken: a wake-up released the GIL"


def test_close_ends_every_coroutine_handed_to_the_loop_and_refuses_later_ones():
    """At unmount the loop is closed with requests still in flight (a read-ahead): each
    coroutine it was given ends with ``CancelledError`` (its ``finally`` runs), whether it had
    started or was only handed over, and none is left never awaited (no RuntimeWarning in the
    daemon's log). One handed over after ``close`` is closed and refused (``RuntimeError``)."""
    import gc
    import warnings

    lt = LoopThread(name="test-loop")
    ended: list[str] = []

    async def request(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(name)

    started = lt.submit(request("started"))
    time.sleep(0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lt._loop.call_soon_threadsafe(time.sleep, 0.2)  # (the loop busy: the next one is only handed over)
        handed = lt.submit(request("handed over"))
        lt.close()
        late = request("late")
        with pytest.raises(RuntimeError, match="closed"):
            lt.submit(late)
        del late
        gc.collect()
    assert sorted(ended) == ["handed over", "started"]
    assert started.cancelled() and handed.cancelled()
    assert [str(w.message) for w in caught] == []
