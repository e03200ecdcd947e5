"""``-o metrics=HOST:PORT``: the mount's counters at ``http://HOST:PORT/metrics`` in the
Prometheus text format, served by ``prometheus_client``.

The figures are those of ``shardfs status`` (``shardfs.app.status.Status.snapshot``: one
source of truth), read at each scrape: the exporter's HTTP thread asks the trio thread for
the document (``trio.from_thread.run_sync``), as the status socket does, so no counter is read
while the thread that owns it changes it. Nothing is kept here between scrapes. ``SERIES``
names every series (doc/SEMANTICS.md lists them). The server binds before the mount goes live
(a port in use fails the mount with one line) and stops when the mount ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardfs.app.statusdoc import StatusDoc

log = logging.getLogger("shardfs")
PREFIX = "shardfs_"
# name (without PREFIX) -> help; counters end in ``_total`` in the exposition
SERIES = {
    "info": "the mount: mountpoint, source (value 1)",
    "uptime_seconds": "seconds since the mount began",
    "requests_total": "FUSE requests answered, by operation",
    "errors_total": "FUSE requests answered with an error, by operation and errno",
    "chunk_files_opened_total": "chunk files opened for reading",
    "read_bytes_total": "bytes read from chunk files",
    "store_requests_total": "requests to the source (GET, PUT, HEAD, LIST, DELETE; READ, REPLACE locally), by kind",
    "store_request_duration_seconds": "latency of the timed requests to the source",
    "store_received_bytes_total": "bytes received from the source",
    "store_sent_bytes_total": "bytes sent to the source",
    "store_retries_total": "reads and folds repeated because the object changed meanwhile",
    "store_failures_total": "requests to the source that failed",
    "cache_hits_total": "cache hits, by cache (index, chunk, range)",
    "cache_misses_total": "cache misses, by cache",
    "cache_bytes": "bytes held, by cache",
    "cache_limit_bytes": "bytes a cache may hold, by cache",
    "pending_chunks": "written chunks not yet folded into their shards",
    "pending_bytes": "bytes of the pending chunks",
    "pending_shards": "shards with pending chunks",
    "journal_bytes": "bytes in the write journal",
    "spill_bytes": "bytes of writes spilled to disk",
    "folds_total": "folds done",
    "fold_failures_total": "folds that failed (retried later)",
    "folds_backing_off": "shards whose fold is backing off after failures",
    "restarts_total": "workers started after one died (the supervisor keeps the mount)",
    "internal_errors_total": "bugs met (each answered EIO or backed off; the mount goes on)",
    "resident_memory_bytes": "the daemon's resident memory",
    "open_files": "the daemon's open file descriptors",
}


def parse_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``-o metrics=`` ``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (loopback);
    ``ValueError`` (one line) otherwise."""
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if colon else "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536 or (colon and not host):
        raise ValueError(f"-o metrics={text}: not HOST:PORT (or PORT, on 127.0.0.1)")
    return host, number


class Exporter:
    """The ``/metrics`` endpoint of one mount: ``start()`` binds (``OSError``), ``serving(token)``
    gives it the trio loop to read the status document on, ``stop()`` ends it."""

    def __init__(self, address: tuple[str, int], snapshot: Callable[[], StatusDoc]) -> None:
        self.address = address
        self._snapshot = snapshot
        self._token: Any = None
        self._server: Any = None

    def start(self) -> None:
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        host, port = self.address
        self._server, _ = start_http_server(port, host, registry=registry)
        log.info("metrics at http://%s/metrics", _netloc(host, port))

    def serving(self, token: Any) -> None:
        """Read the document on the trio loop of ``token`` (``trio.lowlevel.current_trio_token()``)."""
        self._token = token

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _document(self) -> StatusDoc | None:
        import trio

        if self._token is None:
            return None
        try:
            doc: StatusDoc = trio.from_thread.run_sync(self._snapshot, trio_token=self._token)
        except trio.RunFinishedError:
            return None
        return doc

    def collect(self) -> Iterator[Any]:
        """The metric families of the status document now (none before the mount is served)."""
        doc = self._document()
        if doc is not None:
            yield from families(doc)


def families(doc: StatusDoc) -> Iterator[Any]:
    """The Prometheus metric families of status document ``doc``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    def counter(name: str, value: float | None = None, labels: list[str] | None = None,
                rows: list[tuple[list[str], float]] | None = None) -> Any:
        family = CounterMetricFamily(PREFIX + name, SERIES[name], value=value, labels=labels)
        for label_values, n in rows or []:
            family.add_metric(label_values, n)
        return family

    def gauge(name: str, value: float | None = None, labels: list[str] | None = None,
              rows: list[tuple[list[str], float]] | None = None) -> Any:
        family = GaugeMetricFamily(PREFIX + name, SERIES[name], value=value, labels=labels)
        for label_values, n in rows or []:
            family.add_metric(label_values, n)
        return family

    store, reads, pending, folds = doc["store"], doc["reads"], doc["pending"], doc["folds"]
    caches = [(name, c) for name, c in doc["cache"].items() if c is not None]
    yield gauge("info", labels=["mountpoint", "source"], rows=[([doc["mountpoint"], doc["source"]], 1)])
    yield gauge("uptime_seconds", doc["uptime_s"])
    yield counter("requests_total", labels=["operation"], rows=[([op], n) for op, n in doc["requests"].items()])
    yield counter("errors_total", labels=["operation", "errno"],
                  rows=[([op, name], n) for name, by_op in doc["errors"].items() for op, n in by_op.items()])
    yield counter("chunk_files_opened_total", reads["chunk_files"])
    yield counter("read_bytes_total", reads["bytes"])
    yield counter("store_requests_total", labels=["kind"], rows=[([k], n) for k, n in store["requests"].items()])
    latency = store["latency_s"]
    buckets = [(f"{le:g}", n) for le, n in zip(latency["le"], latency["counts"])] + [("+Inf", latency["counts"][-1])]
    yield HistogramMetricFamily(PREFIX + "store_request_duration_seconds", SERIES["store_request_duration_seconds"],
                                buckets=buckets, sum_value=latency["sum"])
    yield counter("store_received_bytes_total", store["bytes_in"])
    yield counter("store_sent_bytes_total", store["bytes_out"])
    yield counter("store_retries_total", store["retries"])
    yield counter("store_failures_total", store["failures"])
    yield counter("cache_hits_total", labels=["cache"], rows=[([name], c["hits"]) for name, c in caches])
    yield counter("cache_misses_total", labels=["cache"], rows=[([name], c["misses"]) for name, c in caches])
    yield gauge("cache_bytes", labels=["cache"], rows=[([name], c["bytes"]) for name, c in caches])
    yield gauge("cache_limit_bytes", labels=["cache"], rows=[([name], c["limit"]) for name, c in caches])
    yield gauge("pending_chunks", pending["chunks"])
    yield gauge("pending_bytes", pending["bytes"])
    yield gauge("pending_shards", pending["shards"])
    yield gauge("journal_bytes", pending["journal_bytes"])
    yield gauge("spill_bytes", pending["spill_bytes"])
    yield counter("folds_total", folds["done"])
    yield counter("fold_failures_total", folds["failed"])
    yield gauge("folds_backing_off", len(folds["backing_off"]))
    yield counter("restarts_total", doc["worker"]["restarts"] if "worker" in doc else 0)  # of a supervised mount
    yield counter("internal_errors_total", doc["internal_errors"]["total"])
    yield gauge("resident_memory_bytes", doc["rss_bytes"])
    yield gauge("open_files", doc["open_files"])


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
