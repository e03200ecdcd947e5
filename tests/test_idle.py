"""A worker gives its free heap back once idle, never under load (``shardfs.app.idle``).

In process, on trio's mock clock: the counters a worker keeps (``RequestStats``, ``StoreStats``)
driven by hand, ``trim_heap`` and the reads' ``rest`` counted. Through a real mount: the worker's resident memory falls
once its readers stop (``test_a_worker_gives_back_its_free_heap_once_idle``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trio
import trio.testing

from shardfs.app import idle
from shardfs.app.status import Counters
from shardfs.base.faults import Faults
from shardfs.kernel.stats import RequestStats
from shardfs.reads import ReadAhead, Reads
from shardfs.reads.chunkcache import ChunkCache
from shardfs.storage.stats import StoreStats

from conftest import serving_pid
from source_kinds import BucketSource, unique_prefix
from sources import Spec, build


def counters() -> Counters:
    return Counters(RequestStats(), StoreStats(), {}, None, Faults(), lambda: 0, lambda: 0)


class Rests(Reads):
    """The reads of a mount, counting the times they were told the worker is idle."""

    def __init__(self) -> None:
        super().__init__(ChunkCache(1 << 20), ReadAhead())
        self.times: list[float] = []

    def rest(self) -> None:
        self.times.append(trio.current_time())


def run_idle(script) -> list[float]:
    """Run ``trim_when_idle`` beside ``script(counters)`` on a mock clock; the times it trimmed
    (the reads were told to rest at each, and only then)."""
    trims: list[float] = []
    reads = Rests()

    async def main() -> None:
        c = counters()
        c.requests.op("read")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle.trim_when_idle, c, reads)
            await script(c)
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock(autojump_threshold=0)
    original = idle.trim_heap
    idle.trim_heap = lambda: trims.append(trio.current_time())
    try:
        trio.run(main, clock=clock)
    finally:
        idle.trim_heap = original
    assert reads.times == trims
    return trims


def request(c: Counters) -> None:
    """One request answered (as ``fuse_ops._guard`` counts it)."""
    c.requests.arrived()
    c.requests.requests["read"] += 1


def test_trims_once_after_a_whole_idle_second_then_waits_for_the_next_request():
    async def script(c: Counters) -> None:
        await trio.sleep(10)

    assert run_idle(script) == [1.0]  # no request since it started: idle at its first look


def test_never_trims_while_requests_come_under_a_second_apart():
    async def script(c: Counters) -> None:
        for _ in range(100):
            await trio.sleep(0.9)
            request(c)

    assert run_idle(script) == []


def test_a_request_being_answered_or_a_store_request_in_flight_is_not_idle():
    async def script(c: Counters) -> None:
        c.requests.active = 1
        await trio.sleep(5.5)  # (never at a whole second: the idle task looks then)
        c.requests.active = 0
        c.store.in_flight = 1
        await trio.sleep(5)
        c.store.in_flight = 0
        await trio.sleep(5)

    assert run_idle(script) == [11.0]  # in flight until 10.5: the look at 11 sees it all idle


def test_trims_again_after_each_new_burst():
    async def script(c: Counters) -> None:
        await trio.sleep(3.25)  # trimmed at 1, then waits
        for _ in range(5):  # at 3.25 (which wakes it: it looks at 4.25, 5.25...), 3.55 ... 4.45
            request(c)
            await trio.sleep(0.3)
        await trio.sleep(10)
        c.store.requests["GET"] = 1  # a store request alone is activity too, but wakes nothing:
        await trio.sleep(10)  # waiting for the next FUSE request, the worker sleeps on

    assert run_idle(script) == [1.0, 6.25]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_worker_gives_back_its_free_heap_once_idle(s3, tmp_path, mount, request):
    """Four readers read every chunk file of an S3 array twice through a mount whose cache
    holds a quarter of it (shards fetched, evicted and fetched again); once they stop, the
    worker's resident memory falls by what they left free (3.6-9 MiB here; without the trim it
    stays the same to the KiB) within 10 s."""
    s = slice
    sp = Spec("big", (2048, 2048), (128, 128), (512, 512), "<i4", 0, ("zstd", 1), inner_crc=False,
              index_location="end", index_crc=True, initial=((s(0, 2048), s(0, 2048)),), write=(s(0, 1), s(0, 1)))
    build(tmp_path / "src", [sp])
    src = BucketSource(tmp_path / "src", s3, unique_prefix(request))
    mnt = src.mount(mount, "-o", "cache_size=4M,workers=1")
    files = [mnt / "big" / f"{i}.{j}" for i in range(16) for j in range(16)]
    pid = serving_pid(mnt)
    with ThreadPoolExecutor(4) as pool:
        passes = [list(pool.map(Path.read_bytes, files)) for _ in range(2)]
    assert passes[0] == passes[1] and min(map(len, passes[0])) > 0
    del passes
    busy = rss_kib(pid)
    deadline = time.monotonic() + 10
    while (rest := rss_kib(pid)) >= busy - 1024 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rest < busy - 1024, f"the worker's RSS after the reads {busy} KiB, 10 s later {rest} KiB"
