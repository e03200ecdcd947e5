"""The kernel's side of a FUSE connection, as the supervisor (``shardfs.app.supervisor``) holds
it: ``/dev/fuse`` opened and mounted on the mountpoint, ``FUSE_NOTIFY_RESEND``, the unmount.

The mount is made as libfuse 3 makes it: as root with mount(2) itself (source the ``fsname``,
type ``fuse.shardfs``, data ``fd=N,rootmode=...,user_id=...,group_id=...`` and the kernel's
options, flags ``nosuid,nodev`` unless ``dev``/``suid`` are given), otherwise (or with
``auto_unmount``) through ``fusermount3``, which gets one end of a socket pair in
``_FUSE_COMMFD`` and sends the opened ``/dev/fuse`` back over it (``SCM_RIGHTS``). Either way
this process holds the connection's one open file; a worker gets the same open file (a
``dup`` through ``SCM_RIGHTS``, not a ``FUSE_DEV_IOC_CLONE`` clone), so the requests it read
and did not answer stay on that file's processing list when it dies, for the next worker to be
sent again (``resend``). On a kernel without ``FUSE_NOTIFY_RESEND`` such requests would wait
for ever: there each worker gets a clone instead (``clone``), and a death fails them. Only the
standard library: the supervisor stays small.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import socket
import stat
import struct
import subprocess

from shardfs.base.libc import LIBC

FUSE_NOTIFY_RESEND = 7  # protocol 7.40 (Linux 6.9): every request read and not answered is sent again
FUSE_DEV_IOC_CLONE = 0x8004E500  # _IOR(229, 0, uint32_t)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_SYNCHRONOUS, MS_DIRSYNC, MS_NOATIME = 1, 2, 4, 8, 16, 128, 1024
MNT_DETACH = 2
_FLAGS = {"ro": (MS_RDONLY, True), "rw": (MS_RDONLY, False), "nosuid": (MS_NOSUID, True),
          "suid": (MS_NOSUID, False), "nodev": (MS_NODEV, True), "dev": (MS_NODEV, False),
          "noexec": (MS_NOEXEC, True), "exec": (MS_NOEXEC, False), "sync": (MS_SYNCHRONOUS, True),
          "async": (MS_SYNCHRONOUS, False), "dirsync": (MS_DIRSYNC, True), "noatime": (MS_NOATIME, True),
          "atime": (MS_NOATIME, False)}
KERNEL = ("allow_other", "default_permissions", "max_read")  # options the kernel itself takes
# Options fixed when the connection is made: a new worker (``shardfs mount`` on a live mount)
# cannot change them (``fixed_changes``).
FIXED = ("ro", "allow_other", "allow_root", "default_permissions", "max_read", "auto_unmount",
         "dev", "suid", "exec", "noexec", "nodev", "nosuid", "atime", "noatime", "sync", "async", "dirsync")

_libc = LIBC


class MountError(Exception):
    """The mount could not be made (one line: why, in libfuse's or fusermount3's words)."""


def mount(mnt: str, fsname: str, options: list[str], read_only: bool) -> tuple[int, socket.socket | None]:
    """Open ``/dev/fuse`` and mount it on ``mnt`` showing ``fsname`` as its source, with the
    libfuse ``options`` (``allow_other``, ``max_read=N``, ``nodev``, ...); the connection's file
    descriptor (close-on-exec) and, with ``auto_unmount``, the socket ``fusermount3`` watches
    (keep it open while the mount lives). ``MountError`` says why not."""
    if os.geteuid() == 0 and "auto_unmount" not in options:
        return _mount_root(mnt, fsname, options, read_only), None
    return _mount_fusermount(mnt, fsname, options, read_only)


def _mount_root(mnt: str, fsname: str, options: list[str], read_only: bool) -> int:
    flags = MS_NOSUID | MS_NODEV
    data = []
    for opt in [*options, "ro" if read_only else "rw"]:
        name = opt.partition("=")[0]
        if name in _FLAGS:
            bit, on = _FLAGS[name]
            flags = flags | bit if on else flags & ~bit
        elif name in KERNEL:
            data.append(opt)
        elif name == "allow_root":
            data.append("allow_other")  # the worker's libfuse refuses other users but root
    try:
        st = os.stat(mnt)
    except OSError as e:
        raise MountError(f"fuse: failed to access mountpoint {mnt}: {e.strerror}") from None
    fd = _open_dev()
    head = f"fd={fd},rootmode={stat.S_IFMT(st.st_mode):o},user_id={os.getuid()},group_id={os.getgid()}"
    args = ",".join([head, *dict.fromkeys(data)]).encode()
    if _libc.mount(fsname.encode(), mnt.encode(), b"fuse.shardfs", ctypes.c_ulong(flags), args) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise MountError(f"fuse: mount failed: {os.strerror(err)}")
    return fd


def check() -> None:
    """``MountError`` (libfuse's words) if this process may not open ``/dev/fuse``."""
    os.close(_open_dev())


def _open_dev() -> int:
    try:
        return os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"fuse: failed to open /dev/fuse: {e.strerror}") from None


def _mount_fusermount(mnt: str, fsname: str, options: list[str], read_only: bool
                      ) -> tuple[int, socket.socket | None]:
    check()  # as libfuse: a user who may not open it gets no mount through fusermount3
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    escaped = fsname.replace("\\", "\\\\").replace(",", "\\,")
    opts = ",".join(["ro" if read_only else "rw", "nosuid", "nodev", f"fsname={escaped}", "subtype=shardfs",
                     *options])
    try:
        proc = subprocess.run(["fusermount3", "-o", opts, "--", mnt], pass_fds=(theirs.fileno(),),
                              env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        ours.close()
        raise MountError(f"fusermount3 failed: {e}") from None
    finally:
        theirs.close()
    try:
        ours.settimeout(5 if proc.returncode == 0 else 0.1)
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 1, 1)
    except OSError:
        fds = []
    if not fds:
        ours.close()
        raise MountError((proc.stderr.strip().splitlines() or ["fusermount3 failed"])[-1])
    ours.settimeout(None)
    os.set_inheritable(fds[0], False)
    if "auto_unmount" in options:
        return fds[0], ours  # fusermount3 unmounts once this socket is closed
    ours.close()
    return fds[0], None


def unmount(mnt: str) -> None:
    """Detach the mount on ``mnt`` (lazily: files open on it keep working until closed)."""
    if os.geteuid() == 0:
        if _libc.umount2(mnt.encode(), MNT_DETACH) == 0 or ctypes.get_errno() in (errno.EINVAL, errno.ENOENT):
            return
    subprocess.run(["fusermount3", "-u", "-q", "-z", "--", mnt], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


def connected(fd: int) -> bool:
    """False once the connection ended (unmounted, or aborted in /sys/fs/fuse/connections)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return not any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _fd, ev in p.poll(0))


def resend(fd: int) -> bool:
    """Ask the kernel to send again every request read on this connection and not answered
    (``FUSE_NOTIFY_RESEND``: they come back with bit 63 of ``unique`` set). False if the
    kernel has no such notification (before Linux 6.9: EINVAL)."""
    try:
        os.write(fd, struct.pack("<IiQ", 16, FUSE_NOTIFY_RESEND, 0))
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True


def clone(fd: int) -> int:
    """A new device file of connection ``fd`` (``FUSE_DEV_IOC_CLONE``, close-on-exec): requests
    read through it and not answered fail (ECONNABORTED) once it is closed, as when its last
    holder dies; a ``dup`` of ``fd`` would keep them waiting for an answer."""
    new = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(new, FUSE_DEV_IOC_CLONE, struct.pack("I", fd))
    except OSError:
        os.close(new)
        raise
    return new


def fixed_changes(before: list[str], after: list[str], ro_before: bool, ro_after: bool) -> list[str]:
    """The options fixed at connection time (``FIXED``) that differ between two option lists
    (``ro`` from the read-only flags): what a takeover cannot change."""
    def fixed(opts: list[str], ro: bool) -> dict[str, str]:
        out = {o.partition("=")[0]: o.partition("=")[2] for o in opts if o.partition("=")[0] in FIXED}
        if ro:
            out["ro"] = ""
        return out
    a, b = fixed(before, ro_before), fixed(after, ro_after)
    return sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))
