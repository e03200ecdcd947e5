"""Live shardfs mounts: which source a mount shows, and which process serves it.

shardfs answers no extended attributes (see ``fuse_ops``), so this is found
from the kernel's mount table (the mount's ``fsname`` is its source
directory) and from the daemons' command lines.
"""

from __future__ import annotations

import errno
import os
import re

from shardfs.storage.urls import is_url

FSTYPE = "fuse.shardfs"


def fsname(src: str) -> str:
    """The ``fsname=`` mount option naming the source: directory ``src`` (made absolute) or
    an object-store URL as given (libfuse unescapes it)."""
    name = src if is_url(src) else os.path.abspath(src)
    return "fsname=" + name.replace("\\", "\\\\").replace(",", "\\,")


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


def daemon_pid(mnt: str) -> int | None:
    """The process serving mountpoint ``mnt``: a ``shardfs mount ... MNT -f`` process whose
    command line names ``mnt`` (relative paths resolved against its working directory)."""
    mnt = os.path.abspath(mnt)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode(errors="surrogateescape") for a in f.read().split(b"\0")]
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if "mount" not in argv or not {"-f", "--foreground"} & set(argv):
            continue
        if not any("shardfs" in a for a in argv[: argv.index("mount")]):
            continue
        rest = argv[argv.index("mount") + 1:]
        if any(os.path.normpath(os.path.join(cwd, a)) == mnt for a in rest if a and not a.startswith("-")):
            return int(entry)
    return None


def dead_source(mnt: str) -> str | None:
    """The source of ``mnt`` if it is a shardfs mount whose daemon is gone (the kernel answers
    every request ENOTCONN, "Transport endpoint is not connected"), else None (a live mount,
    another file system, or nothing mounted there)."""
    src = mounts().get(os.path.abspath(mnt))
    if src is None:
        return None
    try:
        os.stat(mnt)
    except OSError as e:
        return src if e.errno == errno.ENOTCONN else None
    return None
