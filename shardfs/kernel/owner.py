"""Which requests of a writable mount with ``-o workers=N`` the owner worker serves.

Worker 0 (``OWNER``) owns everything written through the mount: the journal and its pending
chunks, the folds, the staging files, the structure changes and the invalidations. The other
workers serve, as on a read-only mount, every request of what was never changed through the
mount, and forward the rest to the owner (``shardfs.kernel.forward``).

What was changed is said by the *marks* (``Marks``): an append-only file the owner writes
before it starts any change (so before the change is acknowledged), each line naming an
*area*, the path of an array or group directory (every node of the view has one: a chunk, a
shard directory or ``.zarray`` its array's, a group's ``.zattrs`` the group's): ``exact``, the
nodes of that area (an array's chunks, a group's listing), or ``tree``, every area at or below
that path (a group renamed or removed, a group's metadata that changes how its arrays are
shown). A worker looks at the file's size at every request it might serve itself (one
``lseek`` to its end: 0.6-0.8 us, an ``fstat`` 1.5-2.3) and reads the new lines when it grew.
A mark is never taken back while the mount lives: the other workers' caches of an area it
names are never trusted again.
"""

from __future__ import annotations

import json
import os
from typing import Any

from shardfs.tree.nodes import ChunkKey, DirKey, MetaKey, StagingKey
from shardfs.tree.nodetable import NodeTable

OWNER = 0  # the slot of the owner worker
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
# requests a worker other than the owner never serves itself: they change the view (symlink, mknod
# and the xattr requests change nothing: every worker refuses them itself, ``Operations.setxattr``)
ALWAYS = frozenset(("create", "write", "fsync", "fsyncdir", "setattr", "rename", "link", "unlink", "rmdir",
                    "mkdir"))
# requests on a handle: served by the worker that opened it (``shardfs.kernel.route``)
HANDLED = frozenset(("read", "release", "flush", "readdir", "releasedir"))


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


class Marks:
    """The areas changed through the mount (see the module docstring), kept in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.exact: set[str] = set()
        self.tree: set[str] = set()
        self._fd = -1
        self._read = 0

    def start(self) -> None:
        """Open (create) the file and read what it holds; ``OSError`` if it cannot be."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.refresh()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def note(self, path: str, tree: bool = False) -> None:
        """Mark area ``path`` (with every area below it if ``tree``), unless it is already."""
        if path in (self.tree if tree else self.exact) or self.covered(path):
            return
        (self.tree if tree else self.exact).add(path)
        if self._fd >= 0:
            os.write(self._fd, json.dumps(["t" if tree else "e", path]).encode() + b"\n")

    def refresh(self) -> None:
        """Read the lines appended since the last look (one ``lseek`` when there are none: the
        file's size without building a stat result; the reads here are ``pread``, the writes appends)."""
        if self._fd < 0 or os.lseek(self._fd, 0, os.SEEK_END) == self._read:
            return
        data = b""
        while True:
            chunk = os.pread(self._fd, 1 << 16, self._read + len(data))
            if not chunk:
                break
            data += chunk
        whole, _, _ = data.rpartition(b"\n")
        self._read += len(whole) + 1 if whole else 0
        for line in whole.split(b"\n") if whole else ():
            try:
                kind, path = json.loads(line)
            except ValueError:
                continue
            (self.tree if kind == "t" else self.exact).add(path)

    def covered(self, path: str) -> bool:
        """True if ``path`` or an area above it is tree-marked."""
        if not self.tree:
            return False
        while True:
            if path in self.tree:
                return True
            if not path:
                return False
            path = path.rpartition("/")[0]

    def touched(self, path: str) -> bool:
        return path in self.exact or self.covered(path)


class Areas:
    """The owner's marking (``before``) and the other workers' choice (``forwards``), given
    the node table that names each inode's area."""

    def __init__(self, nodes: NodeTable, marks: Marks) -> None:
        self.nodes, self.marks = nodes, marks

    def _key(self, ino: int) -> Any:
        try:
            return self.nodes.node_key(ino)
        except Exception:  # noqa: BLE001 - not known here (or not yet: a slot being read): the owner's
            return None

    def area(self, ino: int) -> str | None:
        """The area of inode ``ino``; None if this worker does not know it, or it is a staging
        file (the owner's alone)."""
        key = self._key(ino)
        if key is None or isinstance(key, StagingKey):
            return None
        return key.arr.path if isinstance(key, ChunkKey) else key.path

    # -- the owner: mark what a request is about to change
    def before(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "open":
            if args[1] & WRITE_FLAGS:
                self._mark_ino(args[0])
        elif op == "setattr":
            if args[2].update_size:
                self._mark_ino(args[0])
        elif op in ("create", "mkdir", "unlink", "rmdir"):
            self._mark_name(args[0], args[1])
        elif op == "rename":
            self._mark_name(args[0], args[1])
            self._mark_name(args[2], args[3])
        elif op == "link":
            self._mark_ino(args[0])
            self._mark_name(args[1], args[2])

    def _mark_ino(self, ino: int) -> None:
        key = self._key(ino)
        if key is None or isinstance(key, StagingKey):
            return  # (a staging file changes no area until it is renamed: then its names are marked)
        if isinstance(key, ChunkKey):
            self.marks.note(key.arr.path)
        else:  # a group's metadata may change how every array below it is shown
            self.marks.note(key.path, tree=isinstance(key, MetaKey))

    def _mark_name(self, parent: int, name: bytes) -> None:
        key = self._key(parent)
        if isinstance(key, DirKey):
            self.marks.note(key.path)
            self.marks.note(_join(key.path, os.fsdecode(name)), tree=True)
        else:
            self._mark_ino(parent)

    def unmarked(self) -> bool:
        """The owner has marked nothing: nothing was changed through the mount, and every file
        handle it holds is a read handle of what the source shows (an open for writing, a
        create, marks its area before it is answered)."""
        self.marks.refresh()
        return not (self.marks.exact or self.marks.tree)

    def changed(self, ino: int) -> bool:
        """The owner marked the area of inode ``ino`` (or this worker does not know it)."""
        self.marks.refresh()
        area = self.area(ino)
        return area is None or self.marks.touched(area)

    # -- another worker: True if the owner must serve the request (a request on a handle goes
    # to the worker that opened it: ``shardfs.kernel.route``)
    def forwards(self, op: str, args: tuple[Any, ...]) -> bool:
        if op in ALWAYS:
            return True
        if op not in ("lookup", "getattr", "open", "opendir"):
            return False  # (statfs, requests on handles; forget is split by ``Operations.forget``)
        if op == "open" and args[1] & WRITE_FLAGS:
            return True
        self.marks.refresh()
        area = self.area(args[0])
        if area is None or self.marks.touched(area):
            return True
        if op == "lookup" and (self.marks.exact or self.marks.tree):
            key = self._key(args[0])
            return isinstance(key, DirKey) and self.marks.touched(_join(key.path, os.fsdecode(args[1])))
        return False

    def unknown(self, op: str, args: tuple[Any, ...]) -> bool:
        """True if ``forwards`` sends ``op(*args)`` to the owner only because this worker does
        not know its inode (yet: a number another worker gave out, which the shared ledger
        teaches; then ask ``forwards`` again)."""
        return (op in ("lookup", "getattr", "open", "opendir") and not (op == "open" and args[1] & WRITE_FLAGS)
                and self._key(args[0]) is None)
