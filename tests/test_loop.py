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
    """Another thread ready to run Python gets the GIL whenever a caller releases it (here it
    would keep it for the whole switch interval). While 2000 requests are handed to the loop,
    it never runs: the wake-ups (a byte on the loop's self-pipe each) keep the GIL. With
    asyncio's own ``socket.send`` it runs, and the caller waits seconds for the GIL."""

    async def nothing() -> None:
        return None

    count = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    spinner = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(0.2)
    try:
        spinner.start()
        time.sleep(0.01)  # the spinner holds the GIL whenever this thread lets it go
        before = count[0]
        futures = [loop.submit(nothing()) for _ in range(2000)]
        ran = count[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(old)
        spinner.join()
    assert [f.result(timeout=10) for f in futures] == [None] * 2000
    assert ran == 0, f"the other thread ran {ran} loops while the loop was woken: a wake-up released the GIL"
