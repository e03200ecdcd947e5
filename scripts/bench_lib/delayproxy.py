"""A TCP proxy that delays every byte by a fixed time in each direction (this kernel has no netem),
and can record the HTTP requests that pass through it (the tests count a daemon's S3 requests).

Usage: ``.venv/bin/python scripts/bench_lib/delayproxy.py --upstream HOST:PORT --delay-ms 10
[--port P]`` (stays in the foreground; prints ``listening on 127.0.0.1:P`` once ready), or in
process: ``with DelayProxy(("127.0.0.1", port), delay=0.01) as proxy: ... proxy.port``;
``DelayProxy(..., record=True)`` keeps every HTTP/1.x request sent upstream, in order, in
``proxy.requests`` (``Request(method, path, query, headers)``; ``proxy.clear()`` empties it).

Contract: each accepted connection gets its own upstream connection; bytes read from one side
are written to the other ``delay`` seconds after they were read, in order, without throttling
(so a request/response exchange costs 2 x ``delay`` more than direct, whatever its size). A
half-close is forwarded after the data before it; when the upstream fails or goes away the
client connection is closed (reset if the upstream could not be reached), so clients see a
dropped connection. Recording parses the client-to-upstream stream of each connection as
HTTP/1.x requests (request line, headers, a ``Content-Length`` body; keep-alive); a request it
cannot parse (e.g. a chunked body) is recorded with method ``"?"`` and ends recording on that
connection, so a count never silently misses one. The proxy runs an asyncio loop on its own daemon thread and binds 127.0.0.1
only. Imports only the standard library.
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
    """One HTTP request seen by the proxy: ``path`` percent-decoded, ``headers`` lower-cased names."""

    method: str
    path: str
    query: str
    headers: dict[str, str]


class _RequestParser:
    """Incremental parser of one connection's client-to-server bytes into ``Request``s."""

    def __init__(self, emit: Callable[[Request], None]):
        self._emit = emit
        self._buf = bytearray()
        self._body_left = 0
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        self._buf += data
        while True:
            if self._body_left:
                n = min(self._body_left, len(self._buf))
                del self._buf[:n]
                self._body_left -= n
                if self._body_left:
                    return
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            del self._buf[:end + 4]
            method, target, *_ = head[0].split(" ") + [""]
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            url = urlsplit(target)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._emit(Request("?", unquote(url.path), url.query, headers))
                self._broken = True
                return
            self._emit(Request(method, unquote(url.path), url.query, headers))
            self._body_left = int(headers.get("content-length") or 0)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                observe: Callable[[bytes], None] | None = None) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived; ``observe``
    sees each chunk as it is read."""
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
            if observe is not None and data:
                observe(data)
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
    keep the HTTP requests sent upstream in ``requests``."""

    def __init__(self, upstream: tuple[str, int], delay: float, port: int = 0, record: bool = False):
        self.upstream, self.delay, self.record = upstream, delay, record
        self.requests: list[Request] = []
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayproxy", daemon=True)

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

    def clear(self) -> None:
        """Forget the requests recorded so far."""
        self.requests.clear()

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
        observe = _RequestParser(self.requests.append).feed if self.record else None
        up = asyncio.ensure_future(_pump(creader, uwriter, self.delay, observe))
        down = asyncio.ensure_future(_pump(ureader, cwriter, self.delay))
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
