"""The store requests a mount made, for ``shardfs status`` (``shardfs.app.status``); the FUSE
requests are counted in ``shardfs.kernel.stats``.

Counting costs a plain integer increment where the event happens: no lock, no syscall (the
only clock read is ``time.monotonic``, a vDSO call, around store requests). Counters are
written from the trio thread and, for store requests, from the object store's loop thread
and worker threads: on CPython an in-place add of a ``dict`` item or an attribute runs no
Python code between its read and its write, and the interpreter only switches threads at
calls and backward jumps, so no increment is lost without a lock.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
import time
from collections import deque
from types import TracebackType
from typing import Any, Callable, TypedDict, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds
LATENCY_SAMPLES = 1024  # store requests whose latencies the percentiles are taken over (the last ones)


class LatencyMs(TypedDict):
    p50: float | None
    p99: float | None
    samples: int


class LatencyS(TypedDict):
    le: list[float]  # bucket upper bounds (seconds)
    counts: list[int]  # cumulative
    sum: float


class Store(TypedDict):
    """The store requests made (``StoreStats.snapshot``; ``store`` of the status document)."""

    requests: dict[str, int]
    bytes_in: int
    bytes_out: int
    retries: int
    failures: int
    latency_ms: LatencyMs
    latency_s: LatencyS


class StoreStats:
    """Requests a ``Storage`` made, by kind (``GET``, ``PUT``, ``HEAD``, ``LIST``, ``DELETE`` for
    an object store; ``READ``, ``REPLACE``, ``DELETE`` of shard files locally), bytes received
    and sent, requests shardfs repeated (``retries``: a read or fold that found the object
    changed under it), requests that failed (an error, not an answer such as "missing" or
    "changed"), the latency of the last ``LATENCY_SAMPLES``, and every timed request's latency
    counted in the buckets of ``LATENCY_BOUNDS`` (a histogram since the mount began)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.bytes_in = 0
        self.bytes_out = 0
        self.retries = 0
        self.failures = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.buckets = [0] * (len(LATENCY_BOUNDS) + 1)  # requests of at most each bound (not cumulative), then more
        self.latency_sum = 0.0
        self.in_flight = 0  # timed requests begun and not ended (a status document made meanwhile will change)
        self._flight = threading.Lock()  # (requests begin and end on several threads)

    def count(self, kind: str, seconds: float | None = None, bytes_in: int = 0) -> None:
        """One request of ``kind`` (taking ``seconds``, if timed) that received ``bytes_in``."""
        self.requests[kind] = self.requests.get(kind, 0) + 1
        self.bytes_in += bytes_in
        if seconds is not None:
            self.latencies.append(seconds)
            self.buckets[bisect.bisect_left(LATENCY_BOUNDS, seconds)] += 1
            self.latency_sum += seconds

    def request(self, kind: str, answers: tuple[type[BaseException], ...] = ()) -> "_Timed":
        """``with stats.request("GET") as r: ...; r.bytes_in = n``: counts one timed request;
        an exception other than ``answers`` counts as a failure."""
        return _Timed(self, kind, answers)

    def snapshot(self) -> Store:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 3) if lat else None

        return {"requests": dict(sorted(self.requests.items())), "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out, "retries": self.retries, "failures": self.failures,
                "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "samples": len(lat)},
                "latency_s": {"le": list(LATENCY_BOUNDS), "counts": list(itertools.accumulate(self.buckets)),
                              "sum": round(self.latency_sum, 6)}}


class _Timed:
    """One store request being timed (``StoreStats.request``)."""

    __slots__ = ("stats", "kind", "answers", "started", "bytes_in")

    def __init__(self, stats: StoreStats, kind: str, answers: tuple[type[BaseException], ...]) -> None:
        self.stats, self.kind, self.answers = stats, kind, answers
        self.bytes_in = 0

    def __enter__(self) -> "_Timed":
        with self.stats._flight:
            self.stats.in_flight += 1
        self.started = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stats.count(self.kind, time.monotonic() - self.started, self.bytes_in)
        if isinstance(e, Exception) and not isinstance(e, self.answers):  # not a cancellation
            self.stats.failures += 1
        with self.stats._flight:
            self.stats.in_flight -= 1


def counted(kind: str, answers: tuple[type[BaseException], ...], bytes_in: Callable[[Any], int] | None = None,
            bytes_out: Callable[[Any], int] | None = None) -> Callable[[F], F]:
    """A blocking method of an object with a ``stats: StoreStats``, counted as one timed
    request of ``kind`` (``StoreStats.request``); ``bytes_in``/``bytes_out`` of its result."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.stats.request(kind, answers) as timed:
                result = fn(self, *args, **kwargs)
                if bytes_in is not None:
                    timed.bytes_in = bytes_in(result)
            if bytes_out is not None:
                self.stats.bytes_out += bytes_out(result)
            return result

        return wrapper  # type: ignore[return-value]  # functools.wraps: fn's signature

    return wrap
