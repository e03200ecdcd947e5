"""pyfuse3's request loop with ``shardfs.kernel.fuseloop.ReadLock`` (its read lock without checkpoint or
hand-over) and ``QueuedWait`` (its wait for the next request, without a checkpoint while one is
queued or, with ``Pending``, while trio has nothing else to do, at most ``STREAK`` times in a
row): their contracts under trio, and, through real mounts,
that requests are still read and answered while a handler waits (a chunk read hanging in a
frozen object store), that concurrent readers get exact bytes, and that the daemon ends at the
unmount."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from typing import Awaitable, Callable

import numpy as np
import pytest
import trio
import trio.testing

from conftest import is_mounted
from shardfs.kernel.fuseloop import STREAK, Pending, QueuedWait, ReadLock, trio_epoll
from source_kinds import BucketSource
from sources import build
from test_s3_faults import F, IN_FLIGHT, Outcome, chunk_path, expected_chunk, own_s3  # noqa: F401 (fixture)

G = dataclasses.replace(F, name="g")  # a second array like F (``test_requests_are_served_while...``)


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


def test_a_read_lock_left_by_a_task_that_ends_goes_to_its_waiter():
    """The holder releases the lock and ends without suspending again (the request task at an
    unmount): the parked waiter still gets it."""
    got: list[str] = []

    async def main() -> None:
        lock = ReadLock()
        taken = trio.Event()

        async def holder() -> None:
            async with lock:
                taken.set()
                await trio.testing.wait_all_tasks_blocked()

        async def waiter() -> None:
            await taken.wait()
            async with lock:
                got.append("waiter")

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(holder)
                nursery.start_soon(waiter)

    trio.run(main)
    assert got == ["waiter"]


@pytest.mark.parametrize("watched", [False, True], ids=["alone", "pending"])
def test_queued_wait_skips_the_scheduler_while_readable_at_most_streak_times_in_a_row(watched):
    """Readable: STREAK returns without a checkpoint, then one through trio (a checkpoint);
    then STREAK without again (with a ``Pending`` too: the pass through trio is then a
    checkpoint, not trio's own wait for the descriptor)."""
    a, b = socket.socketpair()
    try:
        b.send(b"x")

        async def main() -> None:
            pending = None
            if watched:
                pending = Pending()
                await pending.watch()
            wait = QueuedWait(pending).wait_readable
            for _ in range(2):
                with trio.testing.assert_no_checkpoints():
                    for _ in range(STREAK):
                        await wait(a.fileno())
                with trio.testing.assert_checkpoints():
                    await wait(a.fileno())

        trio.run(main)
    finally:
        a.close()
        b.close()


def test_queued_wait_waits_through_trio_until_readable():
    """Nothing queued: the wait suspends (other tasks run) until the descriptor is readable."""
    a, b = socket.socketpair()
    order: list[str] = []
    try:

        async def main() -> None:
            wait = QueuedWait().wait_readable

            async def writer() -> None:
                await trio.sleep(0.05)
                order.append("sent")
                b.send(b"x")

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer)
                    await wait(a.fileno())
                    order.append("readable")

        trio.run(main)
    finally:
        a.close()
        b.close()
    assert order == ["sent", "readable"]


class IoWaits(trio.abc.Instrument):
    """Counts trio's own waits for I/O (``epoll_wait`` calls of its run loop)."""

    def __init__(self) -> None:
        self.n = 0

    def before_io_wait(self, timeout: float) -> None:
        self.n += 1


def _idle_run(other: Callable[[list[str]], Awaitable[None]] | None, after: float = 0.3,
              settle: bool = True) -> tuple[list[str], int, float]:
    """In a fresh trio run with a watching ``Pending``: ``other(events)`` started first (if
    given) and, with ``settle``, left to block (else still scheduled to run), then a
    ``QueuedWait`` for a socket that a plain thread makes readable ``after`` seconds on, with
    "readable" then appended to the events. Returns (events, trio's I/O waits during the wait,
    seconds the wait took)."""
    a, b = socket.socketpair()
    events: list[str] = []
    def send() -> None:
        events.append("sent")
        b.send(b"x")

    timer = threading.Timer(after, send)
    try:

        async def main() -> tuple[int, float]:
            pending = Pending()
            await pending.watch()
            wait = QueuedWait(pending).wait_readable
            io = IoWaits()
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    if other is not None:
                        nursery.start_soon(other, events)
                    if settle:
                        await trio.testing.wait_all_tasks_blocked()
                    else:  # other is in the batch of tasks trio runs after this one
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    timer.start()
                    trio.lowlevel.add_instrument(io)
                    t0 = time.monotonic()
                    await wait(a.fileno())
                    took = time.monotonic() - t0
                    trio.lowlevel.remove_instrument(io)
                    events.append("readable")
            return io.n, took

        n, took = trio.run(main)
    finally:
        timer.cancel()
        a.close()
        b.close()
    return events, n, took


def test_this_trio_has_an_epoll_descriptor_for_queued_wait_to_block_on():
    """The installed trio keeps its epoll instance where ``trio_epoll`` looks: otherwise every
    wait of a serial client's request would go through trio's scheduler again (a trio upgrade
    that moves it fails here, not silently in the benchmark)."""

    async def main() -> int:
        return trio_epoll()

    fd = trio.run(main)
    assert fd >= 0


def test_with_nothing_else_to_run_queued_wait_blocks_in_its_own_poll_without_trio():
    """Nothing queued, no other task: the wait blocks until the descriptor is readable with no
    pass through trio's I/O wait at all (and no checkpoint)."""
    events, io_waits, took = _idle_run(None)
    assert events == ["sent", "readable"]
    assert io_waits == 0
    assert 0.25 <= took < 30


def test_a_task_already_scheduled_runs_before_queued_wait_blocks():
    """A task scheduled to run (here: in the same batch) runs at once, not after the request."""

    async def other(events: list[str]) -> None:
        await trio.lowlevel.cancel_shielded_checkpoint()
        events.append("other ran")

    events, _, _ = _idle_run(other, after=1.0, settle=False)
    assert events == ["other ran", "sent", "readable"]


def test_a_threads_result_is_delivered_while_queued_wait_blocks():
    """A thread's result (trio's run_sync_soon) wakes the blocked wait, which lets trio deliver
    it long before the request comes."""

    async def other(events: list[str]) -> None:
        await trio.to_thread.run_sync(time.sleep, 0.05)
        events.append("thread done")

    events, _, _ = _idle_run(other, after=1.0)
    assert events == ["thread done", "sent", "readable"]


def test_trios_next_deadline_is_kept_while_queued_wait_blocks():
    """A sleeping task wakes at its deadline, not when the request comes."""

    async def other(events: list[str]) -> None:
        await trio.sleep(0.1)
        events.append("slept")

    events, _, _ = _idle_run(other, after=1.0)
    assert events == ["slept", "sent", "readable"]


def test_another_descriptor_becoming_readable_is_served_while_queued_wait_blocks():
    """A task waiting on another descriptor (through trio's epoll) runs when it is readable."""
    c, d = socket.socketpair()

    async def other(events: list[str]) -> None:
        threading.Timer(0.1, d.send, (b"y",)).start()
        await trio.lowlevel.wait_readable(c.fileno())
        events.append("other readable")

    try:
        events, _, _ = _idle_run(other, after=1.0)
    finally:
        c.close()
        d.close()
    assert events == ["other readable", "sent", "readable"]


def test_notify_closing_ends_a_queued_wait_for_its_descriptor():
    """pyfuse3's ``terminate()`` (the daemon's SIGTERM) ends its loop by ``notify_closing`` the
    descriptor the loop waits for: a ``QueuedWait`` blocked in its own epoll (never in trio's)
    ends with ``ClosedResourceError`` too, and every later wait for it at once."""
    a, b = socket.socketpair()
    raised: list[str] = []
    try:

        async def main() -> None:
            pending = Pending()
            await pending.watch()
            wait = QueuedWait(pending)

            async def closer() -> None:
                await trio.sleep(0.2)
                wait.notify_closing(a.fileno())

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(closer)
                    for _ in range(2):
                        try:
                            await wait.wait_readable(a.fileno())
                        except trio.ClosedResourceError:
                            raised.append("closed")

        trio.run(main)
    finally:
        a.close()
        b.close()
    assert raised == ["closed", "closed"]


def _waiting_in_epoll(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return "epoll" in f.read()
    except OSError:
        return False


def test_of_two_processes_waiting_for_one_descriptor_one_is_woken_when_it_becomes_readable():
    """Two processes (the workers of ``-o workers=N``, whose clones of one connection share its
    wait queue) wait for one descriptor in their ``QueuedWait``: one byte wakes one of them, not
    both (``EPOLLEXCLUSIVE``; the other would find nothing to read)."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    os.set_blocking(r, False)
    pids: list[int] = []
    try:
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # (a child: never back into pytest)
                try:
                    os.close(r)

                    async def main() -> None:
                        pending = Pending()
                        await pending.watch()
                        await QueuedWait(pending).wait_readable(a.fileno())
                        os.write(w, b"w")

                    trio.run(main)
                finally:
                    os._exit(0)
            pids.append(pid)
        deadline = time.monotonic() + 30
        while not all(_waiting_in_epoll(p) for p in pids):
            assert time.monotonic() < deadline, "the children never waited"
            time.sleep(0.01)
        time.sleep(0.2)
        b.send(b"x")
        time.sleep(1.0)
        woken = b""
        try:
            woken = os.read(r, 16)
        except BlockingIOError:
            pass
        assert woken == b"w"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_read_that_meets_the_end_of_the_connection_with_econnaborted_ends_the_loop_as_enodev(monkeypatch):
    """The kernel answers ECONNABORTED to a read of /dev/fuse when the connection ended (an
    unmount) between taking a request and handing it over (seen with 2 workers at ``umount``),
    or was aborted: the loop ends as at ENODEV, so the daemon ends as after any unmount (and a
    writable mount folds what is pending), not with a traceback."""
    import pyfuse3

    from shardfs.kernel import fuseloop

    async def aborted() -> None:
        async with trio.open_nursery() as nursery:
            async def task() -> None:
                raise ConnectionAbortedError(103, "fuse_session_receive_buf failed: connection abort")
            nursery.start_soon(task)

    async def other() -> None:
        raise OSError(5, "another error")

    monkeypatch.setattr(pyfuse3, "trio", pyfuse3.trio)  # (restored: main() replaces it)
    monkeypatch.setattr(pyfuse3, "main", aborted)
    trio.run(fuseloop.main)  # returns
    monkeypatch.setattr(pyfuse3, "main", other)
    try:
        trio.run(fuseloop.main)
    except OSError as e:
        assert e.errno == 5
    else:
        raise AssertionError("another error of the loop ended it silently")


def test_concurrent_readers_get_exact_bytes_and_the_daemon_ends_at_the_unmount(tmp_path, mount):
    """Four threads open/read/close every chunk file 20 times at once through a writable mount
    (requests queue up, so the loop answers runs of them without trio's scheduler): every read
    gives the bytes of the first one; then ``fusermount3 -u`` (not lazy) unmounts and the daemon
    exits (a hang: not within 30 s)."""
    build(tmp_path / "src", [F])
    mnt = mount(tmp_path / "src")
    arr = mnt / F.name
    names = sorted(n for n in os.listdir(arr) if not n.startswith("."))
    assert len(names) == 16
    want = {n: (arr / n).read_bytes() for n in names}
    bad: list[str] = []

    def reader() -> None:
        for _ in range(20):
            for n in names:
                with open(arr / n, "rb") as f:
                    if f.read() != want[n]:
                        bad.append(n)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert bad == []
    proc = mount.info(mnt).proc
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True, timeout=30)
    proc.wait(timeout=30)
    assert proc.returncode == 0
    assert not is_mounted(mnt)


def test_requests_are_served_while_a_handler_waits_for_a_hung_object_store(own_s3, tmp_path, mount):  # noqa: F811
    """A cold chunk read hangs in a frozen SeaweedFS (its handler waits on the object store);
    meanwhile the same mount answers an open/read/close of a chunk read before, a ``stat`` and
    a listing at once, and the hung read is still pending while they do. The cold chunk is of a
    second array, whose metadata alone was read: nothing of its shards can be cached, by a read
    ahead or otherwise (in a CI run the cold read of a chunk of the first array's last shard
    ended at once, without error; not reproduced, even with the reads ahead given 2 s to end)."""
    built = build(tmp_path / "src", [F, G])
    expected = built[F.name]
    # one process's loop serving while one of its handlers waits (another worker would not have the caches)
    mnt = BucketSource(tmp_path / "src", own_s3, "loop").mount(mount, "-o", "timeout=10,workers=1")
    arr = mnt / F.name
    listing = sorted(os.listdir(arr))
    warm = chunk_path(mnt, (0, 0)).read_bytes()
    np.testing.assert_array_equal(F.decode(warm), expected_chunk(expected, (0, 0)))
    assert (mnt / G.name / ".zarray").stat().st_size > 0  # (its metadata read: the cold read's one GET is a shard's)
    os.kill(own_s3.proc.pid, signal.SIGSTOP)
    try:
        cold = Outcome(mnt / G.name / G.chunk_name((2, 2)))  # nothing of the array's shards read yet
        time.sleep(IN_FLIGHT)
        t0 = time.monotonic()
        assert chunk_path(mnt, (0, 0)).read_bytes() == warm
        assert os.stat(chunk_path(mnt, (0, 0))).st_size == len(warm)
        assert sorted(os.listdir(arr)) == listing
        served = time.monotonic() - t0
        assert cold.thread.is_alive(), f"the cold read ended early: {cold.error!r}"
        # a loop blocked by the hung read answers only when it fails (-o timeout=10), so the
        # cold read would have ended: the bound catches that hang, not a latency
        assert served < 8.0, f"requests beside the hung read took {served:.2f} s"
    finally:
        os.kill(own_s3.proc.pid, signal.SIGCONT)
    cold.join()
    assert cold.error is None, cold.error
    np.testing.assert_array_equal(G.decode(cold.data), G.padded_chunk(built[G.name], (2, 2)))
