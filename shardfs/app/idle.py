"""A worker that goes idle gives its free heap back to the system.

Reading through a mount allocates and frees buffers by the thousand (shards fetched, chunk
files decoded, the kernel's requests), on the trio thread and on obstore's threads, each
thread in its own glibc arena; glibc gives back by itself only the free top of the main arena,
so a burst of reads leaves tens of MiB free inside the heap and counted in the worker's memory
(measured: an S3 mount after four zarr 2.18 readers of the bench's vol, 12-35 MiB of its 217-272
MiB). ``malloc_trim(0)`` gives them back (``base.libc.trim_heap``): once each time the worker
goes idle, never under load (trimming once a second under load cost 7% of the CPU a chunk:
the pages given back are faulted in again by the next buffers, doc/BENCHMARKING.md). It also
closes the shard files a local source's reads keep open for the next chunks (``Reads.rest``):
a file the source deleted or replaced meanwhile holds its disk blocks while open.
"""

from __future__ import annotations

import trio

from shardfs.app.status import Counters
from shardfs.base.libc import trim_heap
from shardfs.reads import Reads

IDLE_S = 1.0  # seconds without a request after which a worker is idle


def _activity(counters: Counters) -> int:
    """A number that changes whenever this worker serves, forwards or sends a request."""
    return (sum(counters.requests.requests.values()) + sum(counters.forwarded().values())
            + sum(counters.store.requests.values()))


async def trim_when_idle(counters: Counters, reads: Reads) -> None:
    """Each time a whole ``IDLE_S`` passes with no request served, forwarded or sent to the store,
    none being answered and none in flight (a read-ahead ends after the request that began it),
    give the free heap back (``trim_heap``) and what ``reads`` keeps (``Reads.rest``), then wait
    for the next request: no timer wakes an idle worker (it looks once or twice, a second apart,
    after its last request: once after its start if none came)."""
    seen = _activity(counters)
    while True:
        await trio.sleep(IDLE_S)
        now = _activity(counters)
        if now == seen and not counters.requests.active and not counters.store.in_flight:
            reads.rest()
            trim_heap()
            await counters.requests.next_request()
            now = -1  # (the request that woke it may not be counted yet: two looks before the next trim)
        seen = now
