"""pyfuse3's request loop with ``shardfs.fuseloop.ReadLock`` (its read lock without checkpoint or
hand-over): the lock's contract under trio, and, through a real mount, that requests are still
read and answered while a handler waits (a chunk read hanging in a frozen object store)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import trio
import trio.testing

from shardfs.fuseloop import ReadLock
from source_kinds import BucketSource
from sources import build
from test_s3_faults import F, IN_FLIGHT, Outcome, chunk_path, expected_chunk, own_s3  # noqa: F401 (fixture)


def test_a_free_read_lock_is_taken_and_released_without_a_checkpoint():
    async def main() -> None:
        lock = ReadLock()
        with trio.testing.assert_no_checkpoints():
            async with lock:
                pass
            async with lock:
                pass

    trio.run(main)


def test_the_read_lock_excludes_and_a_waiter_gets_it_once_the_holder_suspends_outside_it():
    """The holder leaves and re-enters without suspending: it keeps the lock (the woken waiter
    finds it taken). Once the holder suspends outside the lock, the waiter has it."""
    events: list[str] = []

    async def main() -> None:
        lock = ReadLock()

        async def waiter() -> None:
            async with lock:
                events.append("waiter in")
                await trio.sleep(0)
                events.append("waiter out")

        async with trio.open_nursery() as nursery:
            async with lock:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()  # the waiter is parked
                events.append("holder out")
            async with lock:  # straight back, no suspension in between
                events.append("holder in again")
                await trio.testing.wait_all_tasks_blocked()  # the woken waiter found it taken
            events.append("holder out again")
            await trio.testing.wait_all_tasks_blocked()

    async def bounded() -> None:
        with trio.fail_after(10):  # a waiter never woken fails here instead of hanging
            await main()

    trio.run(bounded)
    assert events == ["holder out", "holder in again", "holder out again", "waiter in", "waiter out"]


def test_a_cancelled_waiter_leaves_the_read_lock_usable():
    """The lock is not reentrant: entering it again while holding it waits, here until cancelled."""

    async def main() -> list[bool]:
        lock = ReadLock()
        async with lock:
            with trio.move_on_after(0.05) as scope:
                async with lock:
                    pass
        with trio.testing.assert_no_checkpoints():
            async with lock:
                pass
        return [scope.cancelled_caught]

    assert trio.run(main) == [True]


def test_requests_are_served_while_a_handler_waits_for_a_hung_object_store(own_s3, tmp_path, mount):  # noqa: F811
    """A cold chunk read hangs in a frozen SeaweedFS (its handler waits on the object store);
    meanwhile the same mount answers an open/read/close of a chunk read before, a ``stat`` and
    a listing at once, and the hung read is still pending while they do."""
    expected = build(tmp_path / "src", [F])[F.name]
    mnt = BucketSource(tmp_path / "src", own_s3, "loop").mount(mount, "-o", "timeout=10")
    arr = mnt / F.name
    listing = sorted(os.listdir(arr))
    warm = chunk_path(mnt, (0, 0)).read_bytes()
    np.testing.assert_array_equal(F.decode(warm), expected_chunk(expected, (0, 0)))
    os.kill(own_s3.proc.pid, signal.SIGSTOP)
    try:
        cold = Outcome(chunk_path(mnt, (2, 2)))  # shard (1, 1): nothing of it read yet
        time.sleep(IN_FLIGHT)
        t0 = time.monotonic()
        assert chunk_path(mnt, (0, 0)).read_bytes() == warm
        assert os.stat(chunk_path(mnt, (0, 0))).st_size == len(warm)
        assert sorted(os.listdir(arr)) == listing
        served = time.monotonic() - t0
        assert cold.thread.is_alive(), f"the cold read ended early: {cold.error!r}"
        assert served < 2.0, f"requests beside the hung read took {served:.2f} s"
    finally:
        os.kill(own_s3.proc.pid, signal.SIGCONT)
    cold.join()
    assert cold.error is None, cold.error
    np.testing.assert_array_equal(F.decode(cold.data), expected_chunk(expected, (2, 2)))
