"""A fault-injecting TCP proxy in front of the S3 server: bursts of 503 SlowDown, 500, resets, stalls.

``FaultProxy(upstream, stall)`` is a ``bench_lib.delayproxy.DelayProxy`` without delay whose
``set_fault(kind)`` switches what every *new* connection gets (connections open when a burst
starts are dropped, so clients must reconnect into it):

- ``None``: forwarded unchanged (the proxy is transparent);
- ``"503"``: ``503 SlowDown`` (S3's throttling answer), ``"500"``: ``500 InternalError``, each
  with an S3 XML error body and ``Connection: close``, after the request head was read;
- ``"reset"``: the connection is reset (RST) once the request head arrived;
- ``"stall"``: the request is read and never answered for ``stall`` seconds (past the mount's
  ``-o timeout``), then the connection is reset.

``injected`` counts the requests that got each fault. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_lib.delayproxy import DelayProxy  # noqa: E402

KINDS = ("503", "500", "reset", "stall")
_ANSWERS = {
    "503": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
}
HEAD_TIMEOUT = 30.0


class FaultProxy(DelayProxy):
    """See the module docstring."""

    def __init__(self, upstream: tuple[str, int], stall: float):
        super().__init__(upstream, delay=0.0)
        self.stall = stall
        self.fault: str | None = None
        self.injected: collections.Counter[str] = collections.Counter()
        self._live: set[asyncio.Task] = set()

    def set_fault(self, kind: str | None) -> None:
        """Answer new connections with ``kind`` (None: forward); drop the open ones when a burst starts."""
        assert kind is None or kind in KINDS, kind
        self.fault = kind
        if kind is not None:
            self._loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(self._live)])

    async def _connection(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._live.add(task)
        try:
            kind = self.fault
            if kind is None:
                await super()._connection(creader, cwriter)
            else:
                await self._inject(kind, creader, cwriter)
        finally:
            self._live.discard(task)

    async def _inject(self, kind: str, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(creader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, OSError):
            cwriter.transport.abort()
            return
        self.injected[kind] += 1
        if kind in _ANSWERS:
            status, code, message = _ANSWERS[kind]
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>{message}</Message></Error>").encode()
            cwriter.write(f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                          f"Connection: close\r\n\r\n".encode() + body)
            try:
                await cwriter.drain()
            except OSError:
                pass
            cwriter.close()
            return
        if kind == "stall":
            await asyncio.sleep(self.stall)
        cwriter.transport.abort()
