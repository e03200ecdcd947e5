"""A TCP proxy that delays every byte by a fixed time in each direction (this kernel has no netem).

Usage: ``.venv/bin/python -m testkit.delayproxy --upstream HOST:PORT --delay-ms 10
[--port P]`` (stays in the foreground; prints ``listening on 127.0.0.1:P`` once ready), or in
process: ``with DelayProxy(("127.0.0.1", port), delay=0.01) as proxy: ... proxy.port``.

Contract: each accepted connection gets its own upstream connection; bytes read from one side
are written to the other ``delay`` seconds after they were read, in order, without throttling
(so a request/response exchange costs 2 x ``delay`` more than direct, whatever its size). A
half-close is forwarded after the data before it; when the upstream fails or goes away the
client connection is closed (reset if the upstream could not be reached), so clients see a
dropped connection. The proxy runs an asyncio loop on its own daemon thread and binds 127.0.0.1
only. Imports only the standard library.

Counting (for the bench's requests-per-chunk figures): ``proxy.requests`` counts the HTTP/1.1
requests clients sent through it, by kind: the method (``GET``, ``HEAD``, ``PUT``...), with a
bucket-level GET (an S3 listing) counted as ``LIST``; ``proxy.bytes_down`` counts the bytes the
upstream answered. Request bodies are skipped by their ``Content-Length``; a chunked request
body cannot be followed, so that connection's later requests count as ``UNPARSED`` (once).
``snapshot()`` copies both, from any thread. ``DelayProxy(..., record=True)`` also keeps every
request, in order, in ``proxy.log`` (``Request(method, path, query, headers)``: the kind as
counted, the percent-decoded path, lower-cased header names), for the tests that count one key's
requests and check their ranges and conditions. ``proxy.peak_in_flight`` is the most requests
that were awaiting their answer at once (sent by a client, no byte of the answer back from the
upstream yet), over all connections, since the proxy started or ``reset_peak()``: how many
requests a client had in flight together, whatever the machine's load (the tests check
concurrency with it, not with the wall clock).

Holding (for the tests that need another client to act while a request is on its way):
``proxy.hold(matches)`` holds every request for which ``matches(Request)`` is true, from the
next one parsed on: its bytes, and whatever its connection sends after them, wait in the proxy,
not sent upstream, until ``proxy.release()`` (which also stops holding); each one held is
appended to ``proxy.held`` (as parsed: a request head split over two reads is held from its
second). The answer of a held request comes when the upstream answers it after the release.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import threading
from typing import Callable, NamedTuple
from urllib.parse import unquote, urlsplit


class Request(NamedTuple):
    """One HTTP request seen by the proxy."""

    method: str  # as counted: GET, HEAD, PUT, LIST...
    path: str  # percent-decoded: /BUCKET/KEY
    query: str
    headers: dict[str, str]  # lower-cased names


class _RequestParser:
    """Follows one connection's client-to-upstream byte stream and counts its HTTP requests
    (and appends each to ``log`` when given)."""

    MAX_HEAD = 1 << 16

    def __init__(self, counts: collections.Counter, log: list[Request] | None = None) -> None:
        self.counts = counts
        self.log = log
        self.head = b""
        self.body = 0  # bytes of the current request's body still to skip
        self.lost = False
        self.seen = 0  # requests parsed so far
        self.new: list[Request] = []  # parsed since the caller last took them

    def feed(self, data: bytes) -> None:
        while data and not self.lost:
            if self.body:
                n = min(self.body, len(data))
                self.body -= n
                data = data[n:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > self.MAX_HEAD:
                    self._lose()
                return
            head, data = self.head[:end], self.head[end + 4:]
            self.head = b""
            self._request(head)

    def _request(self, head: bytes) -> None:
        line, *fields = head.split(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._lose()
            return
        method = parts[0].decode("ascii", "replace")
        target = urlsplit(parts[1].decode("ascii", "replace"))
        if method == "GET" and "/" not in target.path.strip("/"):
            method = "LIST"  # path-style bucket-level GET: ListObjects
        self.counts[method] += 1
        self.seen += 1
        headers = {}
        for f in fields:
            name, _, value = f.partition(b":")
            name = name.strip().lower()
            headers[name.decode("latin-1")] = value.strip().decode("latin-1")
            if name == b"content-length":
                self.body = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self._lose()
        request = Request(method, unquote(target.path), target.query, headers)
        self.new.append(request)
        if self.log is not None:
            self.log.append(request)

    def _lose(self) -> None:
        self.lost = True
        self.counts["UNPARSED"] += 1


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                seen: Callable[[bytes], threading.Event | None]) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived (and given to
    ``seen``; a chunk for which ``seen`` returns an event, and those after it, wait until it is set)."""
    loop = asyncio.get_running_loop()
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    more = asyncio.Event()

    async def send() -> None:
        while True:
            while not queue:
                more.clear()
                await more.wait()
            due, data = queue.popleft()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:  # EOF marker
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            gate = seen(data)
            while gate is not None and not gate.is_set():  # held (``DelayProxy.hold``)
                await asyncio.sleep(0.01)
            queue.append((loop.time() + delay, data))
            more.set()
            if not data:
                break
        await sender
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)


class DelayProxy:
    """Forward ``127.0.0.1:port`` to ``upstream`` with ``delay`` seconds each way; with ``record``,
    keep every request in ``log``."""

    def __init__(self, upstream: tuple[str, int], delay: float, port: int = 0, record: bool = False):
        self.upstream, self.delay = upstream, delay
        self.log: list[Request] | None = [] if record else None
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayproxy", daemon=True)
        self.requests: collections.Counter[str] = collections.Counter()
        self.bytes_down = 0
        self.in_flight = 0  # requests awaiting their answer now (changed on the proxy's thread only)
        self.peak_in_flight = 0
        self.held: list[Request] = []  # requests held (``hold``), in order
        self._matches: Callable[[Request], bool] | None = None
        self._gate = threading.Event()

    def __enter__(self) -> "DelayProxy":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def close(self) -> None:
        """Stop accepting and drop every open connection; returns when the thread ended."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()

    def snapshot(self) -> tuple[dict[str, int], int]:
        """(requests by kind, bytes from upstream) counted so far."""
        return dict(self.requests), self.bytes_down

    def hold(self, matches: Callable[[Request], bool]) -> None:
        """Hold the requests ``matches`` accepts until ``release`` (module docstring)."""
        self._gate = threading.Event()
        self._matches = matches

    def release(self) -> None:
        """Send the held requests on, and hold no more."""
        self._matches = None
        self._gate.set()

    def reset_peak(self) -> None:
        """Start ``peak_in_flight`` again from the requests in flight now."""
        self.peak_in_flight = self.in_flight

    def _down(self, data: bytes) -> None:
        self.bytes_down += len(data)

    def _awaiting(self, now: bool) -> None:
        """A connection's request is sent (``now``) or its answer began to come back."""
        self.in_flight += 1 if now else -1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        conns: set[asyncio.Task] = set()

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.ensure_future(self._connection(reader, writer))
            conns.add(task)
            task.add_done_callback(conns.discard)

        server = await asyncio.start_server(accepted, sock=self._sock)
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(conns):
            task.cancel()
        await asyncio.gather(*conns, return_exceptions=True)

    async def _connection(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.transport.abort()  # RST: the client sees the connection refused/reset
            return
        parser = _RequestParser(self.requests, self.log)
        awaiting = False  # a request of this connection is awaiting its answer (HTTP/1.1: one at a time)

        def sent(data: bytes) -> threading.Event | None:
            nonlocal awaiting
            before = parser.seen
            parser.feed(data)
            if parser.seen != before and not awaiting:
                awaiting = True
                self._awaiting(True)
            new, parser.new = parser.new, []
            matches, gate = self._matches, self._gate
            held = [r for r in new if matches is not None and matches(r)]
            self.held += held
            return gate if held else None

        def answered(data: bytes) -> None:
            nonlocal awaiting
            self._down(data)
            if data and awaiting:
                awaiting = False
                self._awaiting(False)

        up = asyncio.ensure_future(_pump(creader, uwriter, self.delay, sent))
        down = asyncio.ensure_future(_pump(ureader, cwriter, self.delay, answered))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() for t in done):  # a reset on one side: drop the other
                up.cancel()
                down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            uwriter.close()
            cwriter.close()
            if awaiting:  # never answered
                self._awaiting(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay-ms", type=float, required=True, help="delay each way, milliseconds")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    proxy = DelayProxy((host, int(port)), args.delay_ms / 1000, args.port)
    print(f"listening on 127.0.0.1:{proxy.port}", flush=True)
    proxy._run()


if __name__ == "__main__":
    main()
