"""Requests one worker of a mount with ``-o workers=N`` forwards to another
(``shardfs.kernel.route`` says which: the owner of a writable mount's writes, or the worker that
opened a handle), and the side that serves them.

Every worker listens on a unix socket of its slot in the mount's state directory (mode 0600,
in this user's own directory; a peer of another user is refused: ``SO_PEERCRED``;
``PeerServer``); a worker keeps one connection to each other slot it forwards to (``PeerLink``,
made at the first request: ``Peers``), over which any number of requests are in flight, each a
frame (4-byte length, ``marshal`` of plain values: pyfuse3's objects are sent as tuples of
their fields). The serving worker calls the same handler the kernel's request would have
reached (``Operations.<op>``, guarded, counted there: it is the worker that must serve it, so it
serves it itself; a READDIR's batches, ``entries``, the listing's own, whose ``OSError`` is
answered with its errno as a guarded handler's), and the answer (a value or an errno) goes back to
the worker, which replies to the kernel through its own descriptor.

A handle the serving worker made (an ``open``, ``create`` or ``opendir``) is the kernel's only
once the forwarding worker has replied to it; if that worker dies first, the kernel sends the
request again (RESEND) and it is served again, and the first handle would get no RELEASE. So a
handle whose answer cannot be sent is released at once (``PeerServer``), and one whose answer
was sent is noted by the kernel's number of the request (``Handed``): that request coming again
is the proof that the answer never reached the kernel, and its first handle is released then.

A connection that breaks (that worker died) is made again once the supervisor started the
next one in its slot, and the requests in flight on it are sent again, marked as re-sent
(``ctx.resent``): what the dead worker did of a non-idempotent one is answered as if it had
replied (``fuse_ops._once``), as for a request the kernel sends again after a worker died.
But the next worker writes FUSE_NOTIFY_RESEND, which moves every request read and not answered
(this worker's too) back to the kernel's queue: a request read before that is the kernel's to
send again, and doing it here too would do it twice (a truncating create after the client's
writes). Each request carries when its worker began it (``time.monotonic``, the same clock in
every process); the next worker answers one begun before its RESEND with ``MOVED``, which the
sender answers with EIO, an answer the kernel drops (the request is no longer that worker's).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import marshal
import os
import socket
import struct
import time
from types import SimpleNamespace
from typing import Any, Callable

import pyfuse3
import trio

from shardfs.base.files import socket_address

log = logging.getLogger("shardfs")
HEADER = struct.Struct("<I")
READDIR_BATCH = 256  # entries a worker asks the owner for at a time (a READDIR forwarded)
MOVED = -1  # the answer to a request begun before the serving worker's RESEND (see the module docstring)
RECONNECT_S = 120.0  # how long a worker waits for the next worker of a slot before failing a request (EIO)
EA = ("st_ino", "generation", "entry_timeout", "attr_timeout", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev",
      "st_size", "st_blksize", "st_blocks", "st_atime_ns", "st_ctime_ns", "st_mtime_ns")
FI = ("fh", "direct_io", "keep_cache", "nonseekable", "noflush")
SF = ("update_atime", "update_mtime", "update_ctime", "update_mode", "update_uid", "update_gid", "update_size")
CTX = ("uid", "gid", "pid", "umask")
# what a worker may ask another: the handlers of ``owner.ALWAYS``/``HANDLED`` and the reads
SERVED = frozenset(("lookup", "getattr", "open", "opendir", "read", "release", "flush", "releasedir", "create",
                    "write", "fsync", "fsyncdir", "setattr", "rename", "link", "unlink", "rmdir", "mkdir", "entries",
                    "counted", "forget"))


class Broken(Exception):
    """The connection to another worker ended (it died) before the answer came."""


def encode(value: Any, resent: bool = False) -> Any:
    """``value`` as what ``marshal`` carries: pyfuse3's objects as ``("ea"|"fi"|"sf"|"ctx", fields)``."""
    if isinstance(value, pyfuse3.EntryAttributes):
        return ("ea", tuple(getattr(value, f) for f in EA))
    if isinstance(value, pyfuse3.FileInfo):
        return ("fi", tuple(getattr(value, f, False) for f in FI))
    if isinstance(value, pyfuse3.SetattrFields):
        return ("sf", tuple(getattr(value, f) for f in SF))
    if isinstance(value, pyfuse3.RequestContext) or hasattr(value, "umask"):
        return ("ctx", (*(getattr(value, f) for f in CTX), resent or bool(getattr(value, "resent", False)),
                        value.unique))
    if isinstance(value, tuple):
        return ("t", tuple(encode(v, resent) for v in value))
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def decode(value: Any) -> Any:
    if not isinstance(value, tuple):
        return value
    kind, fields = value
    if kind == "ea":
        e = pyfuse3.EntryAttributes()
        for f, v in zip(EA, fields):
            setattr(e, f, v)
        return e
    if kind == "fi":
        fi = pyfuse3.FileInfo()
        for f, v in zip(FI, fields):
            if hasattr(fi, f):
                setattr(fi, f, v)
        return fi
    if kind == "sf":
        return SimpleNamespace(**dict(zip(SF, fields)))
    if kind == "ctx":
        return SimpleNamespace(**dict(zip(CTX, fields)), resent=fields[-2], unique=fields[-1])
    if kind == "t":
        return tuple(decode(v) for v in fields)
    raise ValueError(f"cannot decode {kind!r}")


async def _send(stream: trio.SocketStream, lock: trio.Lock, msg: Any) -> None:
    """Send ``msg`` as one frame, whole before any other frame on ``stream`` (``lock``). When the
    lock is free and the socket takes the frame at once (a unix socket's buffer: almost always),
    it is written without a pass through trio's scheduler (``trio.Lock`` and ``send_all`` make
    two or three: a forwarded request costs them twice, its answer twice more)."""
    data = marshal.dumps(msg)
    frame = HEADER.pack(len(data)) + data
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        async with lock:
            await stream.send_all(frame)
        return
    try:
        try:
            sent = os.write(stream.socket.fileno(), frame)  # (the socket is non-blocking: trio's)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            raise trio.BrokenResourceError(e) from e
        if sent < len(frame):
            await stream.send_all(memoryview(frame)[sent:])
    finally:
        lock.release()


async def _frames(stream: trio.SocketStream) -> Any:
    """The messages on ``stream`` until it ends."""
    buf = bytearray()
    while True:
        while len(buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(buf)
            if len(buf) < HEADER.size + n:
                break
            yield marshal.loads(bytes(buf[HEADER.size:HEADER.size + n]))
            del buf[:HEADER.size + n]
        data = await stream.receive_some(1 << 20)
        if not data:
            return
        buf += data


class PeerServer:
    """A worker's side: serve the requests the other workers forward with ``ops`` (the
    mount's ``Operations``)."""

    def __init__(self, path: str, ops: Any, listen: Callable[[str], socket.socket],
                 resent_at: float | None = None) -> None:
        """``listen(path)``: the listening unix socket (``shardfs.app.state.status_listener``: the
        app's, given here so that this room imports none above it); ``resent_at``: when this
        worker asked the kernel to send again what its slot's dead worker had read (before its
        RESEND: ``time.monotonic``), None if it did not."""
        self.path, self.ops, self.listen, self.resent_at = path, ops, listen, resent_at

    async def run(self) -> None:
        sock = self.listen(self.path)  # (a private unix socket)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                uid = struct.unpack("3i", stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid != os.getuid():
                    await stream.aclose()
                    continue
                nursery.start_soon(self._serve, stream)

    async def _serve(self, stream: trio.SocketStream) -> None:
        lock = trio.Lock()
        async with stream, trio.open_nursery() as nursery:
            try:
                async for msg in _frames(stream):
                    nursery.start_soon(self._answer, stream, lock, msg)
            except trio.BrokenResourceError:
                pass

    async def _answer(self, stream: trio.SocketStream, lock: trio.Lock, msg: Any) -> None:
        ident, op, args, *begun = msg
        value = None
        try:
            if op not in SERVED:
                raise pyfuse3.FUSEError(errno.ENOSYS)
            if begun and self.resent_at is not None and op != "forget" and begun[0] < self.resent_at:
                raise pyfuse3.FUSEError(MOVED)  # the kernel sends it again
            handler = getattr(self.ops, "forwarded_forget" if op == "forget" else op)  # (the kernel's: ``forget``)
            args = decode(args)
            value = await handler(*args)
            reply: Any = (ident, True, encode(value))
        except pyfuse3.FUSEError as e:
            reply = (ident, False, e.errno)
        except OSError as e:  # (``entries``, a READDIR's batches, is not guarded: a store's failure to list)
            log.debug("a forwarded %s: %s", op, e.strerror)  # (as ``_guard`` logs the kernel's own)
            reply = (ident, False, e.errno or errno.EIO)
        except Exception:  # (the handlers are guarded: a bug in decoding)
            log.exception("a request forwarded by a worker")
            reply = (ident, False, errno.EIO)
        made = handle_of(op, value)
        try:
            await _send(stream, lock, reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # that worker died: the kernel sends its requests again (RESEND), and a handle this one
            # made never reached it, so no RELEASE of it will ever come
            if made is not None:
                await release_handle(self.ops, *made)
            return
        if made is not None:
            self.ops.handed.note(args[-1].unique, *made)  # (its ``ctx``)


def handle_of(op: str, value: Any) -> tuple[bool, int] | None:
    """``(is a directory's, number)`` of the handle a served ``op`` answered with ``value`` (None
    if it failed), None if it made none."""
    if value is None:
        return None
    if op == "open":
        return False, value.fh
    if op == "create":
        return False, value[0].fh
    if op == "opendir":
        return True, value
    return None


async def release_handle(ops: Any, is_dir: bool, fh: int) -> None:
    """Release handle ``fh``, which the kernel never got (its answer was lost with the worker that
    forwarded the request or made it, or refused after another worker's RESEND): left open, a
    truncating open's handle made every stat of its chunk say 0 bytes, and a reading one pinned
    its version's size, until the name showed another inode (the 2-worker soak: 10-20 s of
    undecodable reads after a worker kill). Its RELEASE discards it (nothing is committed at a
    RELEASE)."""
    with contextlib.suppress(pyfuse3.FUSEError):
        await (ops.releasedir(fh) if is_dir else ops.release(fh))


class Handed:
    """The handles this worker made for requests other workers forwarded, whose answers were sent
    to those workers, by the kernel's number of each request (``ctx.unique``) until released."""

    def __init__(self) -> None:
        self._handles: dict[int, tuple[bool, int]] = {}
        self._requests: dict[tuple[bool, int], int] = {}

    def note(self, unique: int, is_dir: bool, fh: int) -> None:
        """Request ``unique`` made handle ``fh`` (a directory's if ``is_dir``)."""
        self._handles[unique] = (is_dir, fh)
        self._requests[is_dir, fh] = unique

    def take(self, unique: int) -> tuple[bool, int] | None:
        """The handle request ``unique`` made, forgotten here; None if none is noted. Asked when the
        kernel sends that request again: that handle never reached the kernel."""
        made = self._handles.pop(unique, None)
        if made is not None:
            del self._requests[made]
        return made

    def released(self, is_dir: bool, fh: int) -> None:
        """Handle ``fh`` was released: its number may be given out again."""
        unique = self._requests.pop((is_dir, fh), None)
        if unique is not None:
            del self._handles[unique]


class PeerLink:
    """A worker's connection to the worker of another slot: ``call`` waits for its answer (the
    connection's reader runs in the nursery ``run`` opens, or the one ``attach`` gives)."""

    def __init__(self, path: str, forwarded: collections.Counter[str] | None = None,
                 alive: Callable[[], bool] | None = None) -> None:
        """``forwarded``: where the requests sent are counted, by operation (shared by a worker's
        links); ``alive()``: False once the mount's connection ended (unmounted: no worker comes
        back to a slot, so nothing is waited for)."""
        self.path, self.alive = path, alive or (lambda: True)
        self._stream: trio.SocketStream | None = None
        self._lock = trio.Lock()
        self._connecting = trio.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, list[Any]] = {}  # id -> [event, ok, value]
        self._nursery: trio.Nursery | None = None
        # requests sent, by operation (status)
        self.forwarded: collections.Counter[str] = collections.Counter() if forwarded is None else forwarded

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await trio.sleep_forever()

    async def _connect(self) -> trio.SocketStream:
        async with self._connecting:
            if self._stream is not None:
                return self._stream
            deadline = trio.current_time() + RECONNECT_S
            delay = 0.01
            while True:
                try:
                    with socket_address(self.path) as address:
                        stream = await trio.open_unix_socket(address)
                    break
                except OSError:
                    if trio.current_time() > deadline or not self.alive():
                        raise
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.2)
            self._stream = stream
            assert self._nursery is not None
            self._nursery.start_soon(self._receive, stream)
            return stream

    async def _receive(self, stream: trio.SocketStream) -> None:
        try:
            async for ident, ok, value in _frames(stream):
                slot = self._waiting.pop(ident, None)
                if slot is not None:
                    slot[1:] = [ok, value]
                    slot[0].set()
        except (trio.BrokenResourceError, OSError):
            pass
        finally:
            if self._stream is stream:
                self._stream = None
            for ident, slot in list(self._waiting.items()):
                if slot[3] is stream:
                    del self._waiting[ident]
                    slot[1:3] = [None, None]
                    slot[0].set()
            await stream.aclose()

    async def call(self, op: str, args: tuple[Any, ...], counted: str | None = None) -> Any:
        """The other worker's answer to request ``op``; ``FUSEError`` if it failed (EIO if no
        worker of that slot answers for ``RECONNECT_S``). ``counted``: the operation counted in
        ``forwarded`` once the request is sent (in the other's socket, whatever befalls this
        worker then)."""
        resent, begun = False, time.monotonic()
        while True:
            try:
                stream = await self._connect()
            except OSError:
                raise pyfuse3.FUSEError(errno.EIO) from None
            ident = next(self._ids)
            slot: list[Any] = [trio.Event(), None, None, stream]
            self._waiting[ident] = slot
            try:
                await _send(stream, self._lock, (ident, op, encode(args, resent), begun))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self._waiting.pop(ident, None)
                if self._stream is stream:
                    self._stream = None
                resent = True
                continue
            if counted is not None:
                self.forwarded[counted] += 1
                counted = None
            await slot[0].wait()
            if slot[1] is None:  # that worker died meanwhile: ask the next one, as a re-sent request
                log.info("a worker died under a forwarded %s: asking the next one of its slot", op)
                resent = True
                continue
            if not slot[1]:
                if slot[2] == MOVED:
                    log.info("a forwarded %s is the kernel's to send again (its worker died)", op)
                    raise pyfuse3.FUSEError(errno.EIO)  # (dropped by the kernel)
                raise pyfuse3.FUSEError(slot[2])
            return decode(slot[2])

    async def request(self, op: str, args: tuple[Any, ...]) -> Any:
        """The other worker's answer to request ``op`` (a READDIR: the entries it lists, replied
        here as far as the kernel's buffer takes them, and counted as lookups by the worker that
        listed them, as a forwarded LOOKUP is: ``Operations.counted``)."""
        if op != "readdir":
            return await self.call(op, args, op)
        fh, offset, token = args
        taken: list[int] = []
        counted: str | None = "readdir"
        more = True
        while more:
            batch = await self.call("entries", (fh, offset, READDIR_BATCH), counted)
            counted = None
            more = len(batch) == READDIR_BATCH
            for name, fields in batch:
                e = decode(("ea", fields))
                if not pyfuse3.readdir_reply(token, name, e, offset + 1):
                    more = False  # (the kernel's buffer is full)
                    break
                taken.append(e.st_ino)
                offset += 1
        if taken:  # (before the reply reaches the kernel: no FORGET of them can come first)
            await self.call("counted", (taken,))
        return None

    def send_forget(self, forgets: list[tuple[int, int]]) -> None:
        """Give the owner lookups this worker did not count (no answer is awaited)."""
        if self._nursery is not None and forgets:
            self._nursery.start_soon(self._forget, forgets)

    async def _forget(self, forgets: list[tuple[int, int]]) -> None:
        try:
            await self.call("forget", (forgets,), "forget")
        except pyfuse3.FUSEError:
            pass


class Peers:
    """A worker's links to the other slots (``path(slot)``: where that slot's worker listens),
    each made at its first use; ``run`` holds their readers."""

    def __init__(self, path: Callable[[int], str], alive: Callable[[], bool] | None = None) -> None:
        """``alive``: ``PeerLink``'s."""
        self.path, self.alive = path, alive
        self.forwarded: collections.Counter[str] = collections.Counter()  # every link's (status)
        self._links: dict[int, PeerLink] = {}
        self._nursery: trio.Nursery | None = None

    def link(self, slot: int) -> PeerLink:
        link = self._links.get(slot)
        if link is None:
            link = self._links[slot] = PeerLink(self.path(slot), self.forwarded, self.alive)
            if self._nursery is not None:
                link.attach(self._nursery)
        return link

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for link in self._links.values():
                link.attach(nursery)
            await trio.sleep_forever()
