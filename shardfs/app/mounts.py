"""Live shardfs mounts: which source a mount shows, and which process serves it.

shardfs answers no extended attributes (see ``fuse_ops``), so the source is found from the
kernel's mount table (the mount's ``fsname`` is its source directory). The daemon serving a
mount is found through its status socket (``daemon_of``): only the daemon holds the listening
end, and the kernel names its process (``SO_PEERCRED``); a command line, which any process
can copy, is never looked at (doc/SECURITY.md#daemon). It is signalled through a pidfd the
kernel gives for the listener (``pidfd_of``), so never a process that took its pid number.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import struct
from dataclasses import dataclass
from typing import Any

from shardfs.app import state
from shardfs.base import files
from shardfs.storage.urls import is_url

FSTYPE = "fuse.shardfs"
ASK_TIMEOUT = 5.0  # seconds to wait for a daemon's status document
PROBE_TIMEOUT = 2.0  # seconds to wait for the kernel's answer to a stat of a mountpoint
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5: a pidfd of the process that listens


def device(src: str) -> str:
    """What the mount table shows as the mount's source: directory ``src`` (made absolute) or
    an object-store URL as given."""
    return src if is_url(src) else os.path.abspath(src)


def fsname(src: str) -> str:
    """The ``fsname=`` mount option naming the source (``device``; libfuse unescapes it)."""
    return "fsname=" + device(src).replace("\\", "\\\\").replace(",", "\\,")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> dict[str, str]:
    """Mountpoint -> source (directory or URL) of every shardfs mount this process can see."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] == FSTYPE:
                out[_unescape(fields[4])] = _unescape(fields[sep + 2])
    return out


def source_of(path: str) -> str:
    """The source path behind ``path`` if it lies in a shardfs mount, else ``path`` itself.

    A shard directory maps to its shard file; a chunk file or an inner-shard
    directory to the nearest enclosing source file or directory (its shard, or
    the array when it is listed at the array's top level).
    """
    path = os.path.abspath(path)
    for mnt, src in sorted(mounts().items(), key=lambda item: -len(item[0])):
        if is_url(src):
            continue  # an object store: no source file to show
        if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
            rel = os.path.relpath(path, mnt)
            candidate = os.path.normpath(os.path.join(src, rel))
            while candidate != src and not os.path.exists(candidate):
                unsuffixed = candidate.removesuffix(".shard")
                if unsuffixed != candidate and os.path.isfile(unsuffixed):
                    return unsuffixed  # a 1-D array's shard shown as "<key>.shard"
                candidate = os.path.dirname(candidate)
            return candidate
    return path


@dataclass(frozen=True)
class Daemon:
    """A live daemon of this user: its pid, its status socket and the document it sent."""

    pid: int
    socket: str
    doc: dict[str, Any]


def ask(path: str, timeout: float = ASK_TIMEOUT) -> tuple[dict[str, Any], int]:
    """The status document of the daemon listening at unix socket ``path`` and its pid, as the
    kernel says (``SO_PEERCRED``: the process that listens, whatever it claims).
    ``PermissionError`` if that process is not this user's; ``OSError``/``ValueError`` if it
    does not answer, or not with a JSON object."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        with files.socket_address(path) as address:
            sock.connect(address)
        pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != os.geteuid():
            raise PermissionError(errno.EPERM, f"served by uid {uid}, not by this user", path)
        parts = []
        while chunk := sock.recv(1 << 16):
            parts.append(chunk)
    doc = json.loads(b"".join(parts))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a status document")
    return doc, pid


def pidfd_of(daemon: Daemon) -> int:
    """A pidfd of the process listening on ``daemon.socket`` (its pid ``daemon.pid``, this
    user's): a signal sent through it reaches that process or fails (``ProcessLookupError``),
    never one that got its pid number after it ended. The kernel's own reference to the
    listener (``SO_PEERPIDFD``, Linux 6.5); on older kernels ``pidfd_open`` of the peer's pid,
    checked to be this user's. ``ProcessLookupError`` if the listener is gone (its socket held
    by another process), ``PermissionError`` if the listener is not ``daemon.pid`` of this
    user's any more, ``OSError`` if the socket does not answer. The caller closes the fd."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(ASK_TIMEOUT)
        with files.socket_address(daemon.socket) as address:
            sock.connect(address)
        pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != os.geteuid() or pid != daemon.pid:
            raise PermissionError(errno.EPERM, f"served by pid {pid} of uid {uid}, not daemon {daemon.pid}",
                                  daemon.socket)
        try:
            fd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.ENOPROTOOPT, errno.EINVAL):
                raise
            fd = -1 if e.errno == errno.ESRCH else _pidfd_open_own(pid, daemon.socket)
    try:
        signal.pidfd_send_signal(fd, 0)  # the listener ended (its socket lives on in a child)?
    except (ProcessLookupError, OSError) as e:
        if fd >= 0:
            os.close(fd)
        raise ProcessLookupError(errno.ESRCH, f"daemon {pid} is gone ({e.strerror})", daemon.socket) from None
    return fd


def _pidfd_open_own(pid: int, path: str) -> int:
    """``pidfd_open(pid)`` of a process of this user's (kernels before 6.5)."""
    fd = os.pidfd_open(pid)
    if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, f"pid {pid} is not this user's", path)
    return fd


def running(pidfd: int) -> bool:
    """True while the process of ``pidfd`` has not ended (a pidfd is readable once it has)."""
    return not select.select([pidfd], [], [], 0)[0]


def daemons() -> list[Daemon]:
    """Every live daemon of this user that answers on a status socket in this user's own state
    directories (``state.status_sockets``: checked as ``shardfs.base.private`` says)."""
    found = []
    for path in state.status_sockets():
        try:
            doc, pid = ask(path)
        except (OSError, ValueError):
            continue  # left by a killed daemon, or not one of this user's
        found.append(Daemon(pid, path, doc))
    return found


def daemon_of(mnt: str) -> Daemon | None:
    """The daemon serving mountpoint ``mnt``, proven by what only it holds: the listening end of
    a status socket in this user's own state directory (its pid from the kernel, never from
    a command line), whose document names ``mnt``. None if no daemon of this user answers
    for it (another user's mount, a dead one, or one that could not make its socket)."""
    mnt = os.path.abspath(mnt)
    for daemon in daemons():
        if daemon.doc.get("mountpoint") == mnt:
            return daemon
    return None


def stat_errno(path: str, timeout: float = PROBE_TIMEOUT) -> int | None:
    """0 if ``stat(path)`` succeeds, its errno if it fails, None if it has not returned within
    ``timeout`` seconds. The stat runs in a child process, left behind if it does not return: a
    FUSE request that a stopped or stuck daemon has read keeps its caller in uninterruptible
    sleep (not even SIGKILL ends it) until the daemon answers or the connection is aborted."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.closerange(0, 1 << 20)  # left behind, it must hold no pipe its parent's caller waits on
        try:
            os.stat(path)
            code = 0
        except OSError as e:
            code = e.errno or 255
        os._exit(code)
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], timeout)[0]:
            return None
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def unserved(mnt: str) -> tuple[str, str] | None:
    """``(source, state)`` of ``mnt`` if it is a shardfs mount that no daemon serves: state
    "dead" if its daemon is gone (the kernel answers every request ENOTCONN, "Transport endpoint
    is not connected"), "stuck" if a lookup of a name never asked before (which the kernel cannot
    answer from its caches) has no answer within ``PROBE_TIMEOUT`` (a stopped or stuck daemon).
    None for a served mount, another file system, or nothing mounted there."""
    src = mounts().get(os.path.abspath(mnt))
    if src is None:
        return None
    found = stat_errno(os.path.join(mnt, os.fsdecode(files.PROBE) + os.urandom(8).hex()))
    if found is None:
        return src, "stuck"
    return (src, "dead") if found == errno.ENOTCONN else None


def dead_source(mnt: str) -> str | None:
    """The source of ``mnt`` if it is a shardfs mount whose daemon is gone (``unserved``), else None."""
    found = unserved(mnt)
    return found[0] if found is not None and found[1] == "dead" else None
