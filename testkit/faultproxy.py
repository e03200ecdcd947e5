"""A fault-injecting TCP proxy in front of the S3 server: bursts of 503 SlowDown, 500, resets, stalls.

``FaultProxy(upstream, stall)`` is a ``testkit.delayproxy.DelayProxy`` without delay whose
``set_fault(kind)`` switches what every *new* connection gets (connections open when a burst
starts are dropped, so clients must reconnect into it):

- ``None``: forwarded unchanged (the proxy is transparent);
- ``"503"``: ``503 SlowDown`` (S3's throttling answer), ``"500"``: ``500 InternalError``, each
  with an S3 XML error body and ``Connection: close``, after the request head was read;
- ``"reset"``: the connection is reset (RST) once the request head arrived;
- ``"stall"``: the request is read and never answered for ``stall`` seconds (past the mount's
  ``-o timeout``), then the connection is reset.

``injected`` counts the requests that got each fault. Binds 127.0.0.1 only.

``ProxyProcess(upstream, stall)`` runs a ``FaultProxy`` in a process of its own (the soak's
controller is busy parsing op logs: a proxy thread in it starves and clients time out), with
the same ``port``, ``set_fault`` and ``close``; the kind travels through shared memory.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import time

from testkit.delayproxy import DelayProxy

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
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
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


def _serve(upstream: tuple[str, int], stall: float, kind: "multiprocessing.sharedctypes.Synchronized",
           port: "multiprocessing.sharedctypes.Synchronized") -> None:
    proxy = FaultProxy(upstream, stall)
    proxy.start()
    port.value = proxy.port
    current = 0
    while True:
        if kind.value != current:
            current = kind.value
            proxy.set_fault(None if current == 0 else KINDS[current - 1])
        time.sleep(0.02)


class ProxyProcess:
    """A ``FaultProxy`` in its own process (module docstring)."""

    def __init__(self, upstream: tuple[str, int], stall: float):
        ctx = multiprocessing.get_context("spawn")
        self._kind = ctx.Value("i", 0)
        self._port = ctx.Value("i", 0)
        self._proc = ctx.Process(target=_serve, args=(upstream, stall, self._kind, self._port), daemon=True)
        self.port = 0

    def start(self) -> None:
        self._proc.start()
        deadline = time.monotonic() + 30
        while not self._port.value:
            if time.monotonic() > deadline or not self._proc.is_alive():
                raise RuntimeError("the fault proxy did not start")
            time.sleep(0.05)
        self.port = self._port.value

    def set_fault(self, kind: str | None) -> None:
        self._kind.value = 0 if kind is None else KINDS.index(kind) + 1

    def close(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(30)
