"""The daemon's side of ``shardfs status``: its counters as one JSON document, served over a
unix socket in the source's state directory, and logged as one line every ``-o stats_interval``.

The socket is ``<state dir>/status-<pid>.sock`` (``shardfs.app.state.status_socket``), mode 0600
(made under a umask of 0177, in a directory of mode 0700): only the user who mounted reads it.
It is never an entry of the mounted tree, so no client of the mount sees it. A connection gets
the document (``Status.snapshot``) and is closed; nothing is read from it, so a client cannot
make the daemon do anything else. Building the document runs on the trio thread and reads the
counters the layers keep (``shardfs.storage.stats``, the caches, the writeback): no request waits for it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

import trio

from shardfs.app import peers, state
from shardfs.app.statusdoc import StatusDoc, WorkerEntry
from shardfs.base.faults import Faults
from shardfs.base.lru import Counted, counts
from shardfs.kernel.stats import RequestStats
from shardfs.base import private
from shardfs.storage.stats import StoreStats
from shardfs.writes.writeback import Writeback, nothing_pending

log = logging.getLogger("shardfs")
SEND_TIMEOUT = 5.0  # a client that does not read its document is dropped after this
PROBLEM_WINDOW = 60.0  # errors of the last this many seconds are problems


@dataclass
class Counters:
    """Where a mount's counters are, as ``shardfs.app.compose`` registered them: each layer's
    object, whose ``snapshot`` (or counts) is its part of the document."""

    requests: RequestStats  # kernel: the FUSE requests answered
    store: StoreStats  # storage: the store requests made
    caches: dict[str, Counted | None]  # index, chunk, range, listing (None: the mount has none)
    writeback: Writeback | None  # writes: pending changes and folds (None: read-only)
    faults: Faults  # the mount's internal errors
    spilled_bytes: Callable[[], int]  # bytes open files and staging files hold in spill files
    open_handles: Callable[[], int]  # handles the kernel holds open
    # requests sent to the owner worker of a writable mount (``-o workers=N``), by operation
    forwarded: Callable[[], dict[str, int]] = dict
    # with ``-o workers=auto``: whether this worker is parked (``shardfs.kernel.elastic``; None: never)
    parked: Callable[[], bool | None] = lambda: None


class Status:
    """What one mount shows to ``shardfs status``: the mount's identity and its ``counters``."""

    def __init__(self, counters: Counters, mountpoint: str, source: str, endpoint: str | None, read_only: bool,
                 options: dict[str, str], socket_path: str | None, interval: float | None = None) -> None:
        """``endpoint``: an object store's endpoint in effect (None: the service's default, or a
        directory); ``shardfs inspect`` of a path in the mount reaches the store through it."""
        self.supervision: dict[str, Any] | None = None
        self._given: socket.socket | None = None  # the supervisor's listening socket
        self.counters = counters
        self.mountpoint, self.source, self.read_only, self.options = mountpoint, source, read_only, options
        self.endpoint = endpoint
        self.socket_path = socket_path
        self.interval = interval
        self.started = time.monotonic()

    def supervised(self, listener: socket.socket | None, supervision: dict[str, Any]) -> None:
        """This is a supervisor's worker: serve the supervisor's listening socket ``listener``
        (None: it has none), which ``shardfs status`` and ``umount`` find as the supervisor's,
        and show ``supervision``: ``supervisor_pid``, ``worker_pid``, ``worker_started`` (epoch
        seconds), ``restarts``, ``takeovers``, ``last_reason``."""
        self._given, self.supervision = listener, supervision
        if listener is None:
            self.socket_path = None

    def snapshot(self) -> StatusDoc:
        """The status document (``doc/`` lists its fields); counts since the mount began. With
        ``-o workers=N``, of the mount as a whole: the other workers' last documents added
        (``shardfs.app.peers``)."""
        doc = self.own()
        if "workers" in doc:
            sup = self.supervision or {}
            doc = peers.total(doc, peers.others(sup["workers_file"], [w["index"] for w in doc["workers"]],
                                                sup.get("worker_slot", 0)))
        return doc

    def own(self) -> StatusDoc:
        """The status document of this process alone."""
        c = self.counters
        requests = c.requests.snapshot()
        writes = c.writeback.snapshot() if c.writeback is not None else nothing_pending()
        writes["pending"]["spill_bytes"] = c.spilled_bytes()
        rss, open_files = _process()
        doc: StatusDoc = {
            "mountpoint": self.mountpoint, "source": self.source, "endpoint": self.endpoint, "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started, 1), "read_only": self.read_only,
            "options": dict(self.options),
            "requests": requests["requests"], "errors": requests["errors"], "reads": requests["reads"],
            "store": c.store.snapshot(),
            "cache": {name: None if cache is None else counts(cache) for name, cache in c.caches.items()},
            "pending": writes["pending"], "folds": writes["folds"],
            "internal_errors": c.faults.snapshot(), "errors_last_minute": c.requests.errors_since(PROBLEM_WINDOW),
            "rss_bytes": rss, "open_files": open_files, "open_handles": c.open_handles(),
            "forwarded": c.forwarded()}
        if self.supervision is not None:
            sup = self.supervision
            doc["pid"] = sup["supervisor_pid"]
            doc["worker"] = {"pid": sup["worker_pid"], "started": sup["worker_started"],
                             "restarts": sup["restarts"], "takeovers": sup["takeovers"],
                             "last_reason": sup["last_reason"]}
        workers = self._workers()
        if workers:  # ``-o workers=N``: each worker, and the mount's memory is theirs together
            parked = c.parked()
            if parked is not None:
                for w in workers:
                    if w["this"]:
                        w["parked"] = parked
            doc["workers"] = workers
            doc["rss_bytes"] = sum(w["rss_bytes"] for w in workers)
        return doc

    def _workers(self) -> list[WorkerEntry]:
        """The workers of a supervised mount of more than one (the supervisor's list), each with
        its ``index``, ``pid``, ``started``, ``rss_bytes`` and ``cpu_s`` (user + system)."""
        path = (self.supervision or {}).get("workers_file")
        if not path:
            return []
        try:
            with open(path, "rb") as f:
                listed = json.loads(f.read())
        except (OSError, ValueError):
            return []
        if not isinstance(listed, list) or len(listed) < 2:
            return []
        out: list[WorkerEntry] = []
        for w in listed:
            rss, cpu = _of_process(int(w.get("pid", 0)))
            out.append({"index": w.get("index"), "pid": w.get("pid"), "started": w.get("started"),
                        "rss_bytes": rss, "cpu_s": cpu, "this": w.get("pid") == os.getpid()})
        return out

    async def run(self) -> None:
        """Serve the socket (if it can be made) and log the summary every ``interval`` seconds,
        until cancelled; the socket is removed at the end."""
        async with trio.open_nursery() as nursery:
            if self.interval:
                nursery.start_soon(self._log_every, self.interval)
            if (self.supervision or {}).get("worker_count", 1) > 1:
                nursery.start_soon(self._publish)
            listener = self._listen()
            if listener is None:
                return
            try:
                await trio.serve_listeners(self._answer, [trio.SocketListener(listener)])
            finally:
                if self._given is None:  # (the supervisor's outlives this worker)
                    _unlink(self.socket_path)

    def _listen(self) -> trio.socket.SocketType | None:
        """The listening socket at ``socket_path`` (or the supervisor's, ``supervised``); None
        (logged) if it cannot be made."""
        if self._given is not None:
            return trio.socket.from_stdlib_socket(self._given)
        path = self.socket_path
        if path is None:
            return None
        try:
            sock = state.status_listener(path)
        except (OSError, private.Refused) as e:
            log.warning("shardfs status unavailable: cannot make the socket %s: %s", path,
                        getattr(e, "strerror", None) or e)
            return None
        return trio.socket.from_stdlib_socket(sock)

    async def _answer(self, stream: trio.SocketStream) -> None:
        """Send the document; a failure to make it is logged, never raised (it would end the
        mount's nursery, and the mount with it)."""
        try:
            data = (json.dumps(self.snapshot()) + "\n").encode()
        except Exception:
            log.exception("shardfs status: cannot make the status document")
            await stream.aclose()
            return
        with trio.move_on_after(SEND_TIMEOUT):
            try:
                await stream.send_all(data)
            except trio.BrokenResourceError:
                pass
        await stream.aclose()

    async def _publish(self) -> None:
        """Write this worker's document for the others every ``peers.PUBLISH_S`` seconds; when
        nothing in it changes before the next request (``quiet``, no request being answered, no
        store request in flight: a read-ahead, an index read ahead, a listing, begun by a request
        and ending after it), wait for that request first: the document written stays exact
        meanwhile, and no timer wakes a worker of an idle mount."""
        sup = self.supervision or {}
        while True:
            doc: StatusDoc | None = None
            try:
                doc = self.own()
                peers.publish(sup["workers_file"], sup.get("worker_slot", 0), doc)
            except Exception:
                log.exception("shardfs status: cannot make the status document")
            store = self.counters.store
            # (and its workers listed: a document written before the supervisor's list, with no
            # entry of its own, shows no ``parked``; a parked worker gets no request to write again)
            if (doc is not None and "workers" in doc and quiet(doc) and not self.counters.requests.active
                    and not store.in_flight and sum(store.requests.values()) == sum(doc["store"]["requests"].values())):
                await self.counters.requests.next_request()
            await trio.sleep(peers.PUBLISH_S)

    async def _log_every(self, seconds: float) -> None:
        while True:
            await trio.sleep(seconds)
            try:
                line = summary(self.snapshot())
            except Exception:
                log.exception("shardfs status: cannot make the status document")
                return
            log.info("stats: %s", line)


def quiet(doc: StatusDoc) -> bool:
    """Nothing in this worker's status document ``doc`` changes before its next request (once
    the requests being answered are, ``RequestStats.active``): no pending chunk to fold, no
    fold running or backing off, no error of the last minute (which would age out of it), no
    handle open (another worker may release it: ``Reopen.following``)."""
    pending, folds = doc["pending"], doc["folds"]
    return not (pending["chunks"] or folds["current"] or folds["backing_off"]
                or doc["errors_last_minute"] or doc["open_handles"])


def summary(doc: StatusDoc) -> str:
    """One line: what ``-o stats_interval`` logs."""
    store = doc["store"]
    lat = store["latency_ms"]
    pending, folds = doc["pending"], doc["folds"]
    errors = sum(n for by_op in doc["errors"].values() for n in by_op.values())
    return (f"{sum(doc['requests'].values())} requests ({errors} errors), {doc['reads']['chunk_files']} chunk files "
            f"{doc['reads']['bytes']} bytes read; store {sum(store['requests'].values())} requests "
            f"({store['failures']} failed, p50 {lat['p50']} ms, p99 {lat['p99']} ms); pending {pending['chunks']} "
            f"chunks in {pending['shards']} shards; folds {folds['done']} done, {folds['failed']} failed, "
            f"{len(folds['backing_off'])} backing off; rss {doc['rss_bytes']} bytes, {doc['open_files']} open files")


def _of_process(pid: int) -> tuple[int, float]:
    """Process ``pid``'s resident memory (bytes) and CPU time (seconds); zeros if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0, 0.0
    return rss, round(cpu, 2)


def _process() -> tuple[int, int]:
    """This process's resident memory (bytes) and open file descriptors."""
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = 0
    try:
        files = len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        files = 0
    return rss, files


def _unlink(path: str | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("%s: cannot remove: %s", path, e.strerror)

