"""The hierarchy the mount shows: groups and arrays read from their ``zarr.json`` (re-read when
it changes), described as v2, with a slot each in the chunk-inode space.

``Hierarchy.node(path)`` is the group or array at ``path`` (None if there is none); a bad
``zarr.json`` or an array that cannot be shown as v2 gives an ``ArrayNode`` without ``info``,
whose ``error`` says why (logged once per version of the file). ``version`` asks a key's
version as every lookup does: inline when the source answers at once, else in a worker
thread; an unusable key raises its errno, logged once per key and reason. Runs on the trio
thread.
"""

from __future__ import annotations

import errno
import hashlib
import logging
from typing import TYPE_CHECKING, Any, Callable

from shardfs.format.layout import Unpresentable
from shardfs.storage import UNKNOWN, Range, Storage, Unusable, Version, Unknown
from shardfs.base.attrs import fail
from shardfs.storage.keys import join
from shardfs.base.threads import blocking, blocking_read
from shardfs.tree import metadata
from shardfs.tree.ledger import Ledger
from shardfs.tree.nodes import GONE, ArrayNode, GroupNode, Unbound

if TYPE_CHECKING:
    from shardfs.format.v2 import ArrayInfo

log = logging.getLogger("shardfs")


def v2() -> Any:
    """``shardfs.format.v2`` (zarr-python: a quarter of a second to import), imported here on
    first use; a daemon has imported it before it goes live (``shardfs.app.run._mount_and_serve``)."""
    from shardfs.format import v2 as module

    return module


def read_metadata(source: Storage, key: str, known: Version | Unknown) -> tuple[dict[str, Any] | str, Version]:
    """The parsed zarr.json at ``key``, or why it is bad (``shardfs.tree.metadata``), and the version
    read: one request of at most ``METADATA_MAX`` + 1 bytes (none if ``known``, its version,
    is too large already), in a worker thread."""
    reason = metadata.too_large(known.size) if isinstance(known, Version) else None
    if reason:
        return reason, known  # type: ignore[return-value]  # a Version: too_large found a reason
    data, version = source.read_versioned(key, Range(0, metadata.METADATA_MAX + 1))
    try:
        reason = metadata.too_large(version.size)
        if reason:
            raise metadata.BadMetadata(reason)
        return metadata.parse(data), version
    except metadata.BadMetadata as e:
        return str(e), version




def _layout_id(info: Any) -> str:
    """A name of an array's chunk layout that every worker computes alike ("" without one)."""
    if info is None:
        return ""
    return hashlib.sha256(repr(info.layout).encode()).hexdigest()[:16]


class ArrayTable(dict[str, ArrayNode]):
    """``Hierarchy.arrays``: the arrays read, by path. ``table[path]`` of an array not read yet
    whose slot a dead worker gave out (``reserved``, by ``Hierarchy.restore``) raises
    ``Unbound`` (read it, then ask again), of any other path KeyError."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: dict[str, int] = {}  # path -> the slot it gets when first read

    def __missing__(self, path: str) -> ArrayNode:
        if path in self.reserved:
            raise Unbound(path)
        raise KeyError(path)


class Hierarchy:
    """The groups and arrays of one mount over ``source`` (``ome``: OME-Zarr translation;
    ``c_order``: ``-o c_order``; ``mount_ns``: the mount's time, for nodes without a version).
    ``slots``: the arrays by slot, shared with the node table."""

    def __init__(self, source: Storage, ome: bool, c_order: bool, mount_ns: int, ledger: Ledger | None = None) -> None:
        """``ledger``: where each new slot is noted (``shardfs.tree.ledger``)."""
        self.source = source
        self.ledger = ledger or Ledger()
        self.ome = ome
        self.c_order = c_order
        self.mount_ns = mount_ns
        self.arrays = ArrayTable()
        self.slots: list[ArrayNode] = []
        # A restarted worker's slots not read yet (``restore``): path -> slot, and every slot
        # given out but not bound here (also a shared ledger's: ``follow``) -> its path.
        self._reserved = self.arrays.reserved
        self.bound: list[Callable[[int], None]] = []  # told of each slot bound from ``unbound``
        self._groups: dict[str, GroupNode] = {}
        self._unusable: set[tuple[str, str]] = set()  # (key, reason) already logged
        # A shared ledger (``-o workers=N``): the slots other workers gave out, by path and layout
        # (``follow``), and those not yet bound to an array here (``load_followed``).
        self._followed: dict[tuple[str, str], int] = {}
        self._unbound: dict[int, str] = {}
        self.unbound = self._unbound  # (read by the node table: a chunk inode of one is ``Unbound``)
        self.ledger.followers.append(self.follow)

    async def version(self, key: str, ask: bool = True) -> Version | None | Unknown:
        """``source.version`` (inline when it is answered at once, ``Storage.version_now``, else
        in a worker thread; ``UNKNOWN`` then if not ``ask``); a key that exists but is unusable (not a
        regular file, behind a symlink out of the source) raises its errno, logged once per key and reason."""
        try:
            return await self._current(key, ask)
        except Unusable as e:
            self.log_unusable(key, e)
            raise fail(e.errno, e.strerror) from None

    async def _current(self, key: str, ask: bool = True) -> Version | None | Unknown:
        """``source.version``: inline when it is answered at once, else in a worker thread (or
        ``UNKNOWN`` if not ``ask``)."""
        found = self.source.version_now(key)
        return await blocking_read(self.source.version, key) if found is UNKNOWN and ask else found

    def log_unusable(self, key: str, e: Unusable) -> None:
        """Log why ``key`` is not read, once per key and reason."""
        if (key, e.strerror) not in self._unusable:
            if len(self._unusable) >= 4096:
                self._unusable.clear()
            self._unusable.add((key, e.strerror))
            log.error("%s: not read: %s", self.source.describe(key), e.strerror)

    async def node(self, path: str) -> ArrayNode | GroupNode | None:
        """The group or array at ``path`` (re-read when its zarr.json changes), or None if
        ``path`` has no zarr.json (or only one behind a symlink out of the source).

        A bad zarr.json (``shardfs.tree.metadata``), and an array that cannot be shown as v2,
        give an ``ArrayNode`` without ``info``: a directory without metadata or entries,
        whose ``error`` (also logged once per version of the file) says why.
        """
        key = join(path, "zarr.json")
        arr, group = self.arrays.get(path), self._groups.get(path)
        version: Version | None | Unknown = UNKNOWN
        try:  # a node seen before is checked (a stat, a HEAD); a new one is read in one request
            version = await self._current(key, ask=arr is not None or group is not None)
            if version is None:
                return None
            if arr is not None and arr.version == version and arr.image == self._in_image(path):
                return arr
            if group is not None and group.version == version:
                return group
            doc, version = await blocking(read_metadata, self.source, key, version)
        except Unusable as e:  # never read from: not a regular file (opened non-blocking), or out of SRC
            if e.errno == errno.EIO:  # not a regular file: a node without metadata, saying why
                return self._store_array(path, Version(0, 0, self.mount_ns), None, f"zarr.json: {e.strerror}")
            self.log_unusable(key, e)  # behind a symlink out of the source: as if absent
            return None
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.EIO:  # a failed read (a store that did not answer, logged there):
                raise fail(errno.EIO) from None  # this request alone fails
            doc = f"zarr.json is unreadable: {e.strerror or e}"
            version = version if isinstance(version, Version) else Version(0, 0, self.mount_ns)
        assert isinstance(version, Version)  # read above, or made for an unreadable file
        if isinstance(doc, str):
            return self._store_array(path, version, None, doc)
        try:
            if doc["node_type"] == "group":
                zgroup, zattrs = v2().group_files(doc, self.ome)
                attrs = doc.get("attributes")
                node = GroupNode(path, version, zgroup, zattrs, isinstance(attrs, dict) and v2().is_ome_image(attrs))
                self._groups[path] = node
                return node
            parent = await self.node(path.rpartition("/")[0]) if path else None
            image = isinstance(parent, GroupNode) and parent.image
            info = v2().describe_array(doc, self.ome, image, self.c_order)
            if image and info.layout.keys.view_separator != "/":
                log.warning("%s: OME-Zarr array with v2 \"/\" chunk keys: its v2 keys keep \".\" (the source's "
                            "directories of shards take the \"/\" names)", self.source.describe(key))
            return self._store_array(path, version, info, None, image,
                                     parent.version.mtime_ns if isinstance(parent, GroupNode) and image else 0)
        except (metadata.BadMetadata, Unpresentable) as e:
            return self._store_array(path, version, None, str(e))
        except OSError as e:  # the parent group's metadata (a failed read: this request alone fails)
            if e.errno == errno.EIO:
                raise fail(errno.EIO) from None
            return self._store_array(path, version, None, f"zarr.json is unreadable: {e.strerror or e}")
        except Exception as e:  # zarr's metadata classes raise many types for bad documents
            return self._store_array(path, version, None, f"invalid metadata: {e!r}")

    def _store_array(self, path: str, version: Version, info: ArrayInfo | None, error: str | None,
                     image: bool | None = None, parent_mtime_ns: int = 0) -> ArrayNode:
        """Remember the array (or hidden node) at ``path``; a hidden node's reason is logged
        when it is new or changed. ``image``: in an OME-Zarr image group (None: as last read)."""
        image = self._in_image(path) if image is None else image
        old = self.arrays.get(path)
        if error is not None and old is not None and (old.version, old.error, old.image) == (version, error, image):
            return old
        if error is not None:
            log.error("%s: not shown as v2: %s", self.source.describe(path), error)
        # A new layout (a resize, or an array deleted and made again) gets a new slot: the
        # kernel may still hold dentries of the old chunk inodes, which keep naming the old
        # geometry's chunks instead of other chunks of the new one.
        same = old is not None and (old.info.layout if old.info else None) == (info.layout if info else None)
        lineage = old.lineage if old is not None else []
        if same:
            assert old is not None
            arr = ArrayNode(path, old.slot, version, info, error, image=image, parent_mtime_ns=parent_mtime_ns,
                            lineage=lineage)
            self.slots[old.slot] = arr
        elif not self.ledger.shared and old is None and path in self._reserved:  # the slot a dead worker gave it
            kept = self._reserved.pop(path)
            self._unbound.pop(kept, None)
            arr = ArrayNode(path, kept, version, info, error, image=image, parent_mtime_ns=parent_mtime_ns,
                            lineage=lineage)
            self.slots[kept] = arr
            lineage.append(kept)
            self._bound(kept)
        elif not self.ledger.shared:
            arr = ArrayNode(path, len(self.slots), version, info, error, image=image,
                            parent_mtime_ns=parent_mtime_ns, lineage=lineage)
            self.slots.append(arr)
            lineage.append(arr.slot)
            self.ledger.note("a", arr.slot, path)
        else:
            layout = _layout_id(info)
            with self.ledger.locked():  # the slot another worker gave this array in this layout, or a new one
                slot = self._followed.get((path, layout))
                if slot is None:
                    slot = len(self.slots)
                    self.ledger.note("a", slot, path, layout)
                    self._followed[(path, layout)] = slot
                was_unbound = self._unbound.pop(slot, None) is not None
                self._placeholders(slot + 1)
                arr = ArrayNode(path, slot, version, info, error, image=image, parent_mtime_ns=parent_mtime_ns,
                                lineage=lineage)
                self.slots[slot] = arr
                lineage.append(slot)
                if was_unbound:
                    self._bound(slot)
        self.arrays[path] = arr
        return arr

    async def restore(self, records: list[list[Any]]) -> None:
        """Give each array of ``records`` (a dead worker's ledger) the slot it had there, as it is
        when first used (its chunk inodes then mean the same chunks): nothing is read here, so a
        restarted worker serves at once however many arrays the dead one had read (on an object
        store, one ``zarr.json`` GET each). Until its array is read (``bind``, or any lookup of
        its path), a slot's chunk inodes and its array's directories raise ``Unbound``. Slots
        that cannot have their array back (gone, another layout, an earlier layout of an array
        that has a later slot) are left to a node without metadata (``GONE``): their chunk inodes, and
        aliases of them, answer ESTALE (``NodeTable.node_key``: the kernel looks the name up again)."""
        by_slot: dict[int, str] = {}  # a slot's path as last noted (a move notes it again)
        for rec in records:
            if rec[0] == "a" and isinstance(rec[1], int) and isinstance(rec[2], str):
                by_slot[rec[1]] = rec[2]
        last: dict[str, int] = {}  # a path's latest slot
        for slot, path in by_slot.items():
            last[path] = max(last.get(path, -1), slot)
        self._placeholders(max(last.values(), default=-1) + 1)
        for path, slot in last.items():
            if self.slots[slot].error == GONE and path not in self.arrays:
                self._reserved[path] = slot
                self._unbound[slot] = path

    async def bind(self, path: str) -> bool:
        """Read the array at ``path`` if a slot of it is not bound here (``restore``, or another
        worker's: ``follow``), binding it; True if there was one. A failed read (EIO) fails the
        request and leaves the slot to the next; a path that holds no array of that slot now
        leaves it to a node without metadata (``GONE``)."""
        if path not in self._reserved and path not in self._unbound.values():
            return False
        await self.node(path)
        slot = self._reserved.pop(path, None)  # (still there: no array at ``path`` now)
        if slot is not None:
            self._unbound.pop(slot, None)
        return True

    def _bound(self, slot: int) -> None:
        for hook in self.bound:
            hook(slot)

    def _placeholders(self, n: int) -> None:
        """At least ``n`` slots, those added without an array (``GONE`` until bound)."""
        while len(self.slots) < n:
            self.slots.append(ArrayNode("", len(self.slots), Version(0, 0, self.mount_ns), None, GONE))

    def follow(self, records: list[list[Any]]) -> None:
        """Learn the slots other workers gave out (a shared ledger's new ``records``): a slot
        stays unbound here (``GONE``) until ``load_followed`` or a read of its array binds it."""
        for rec in records:
            if rec[0] == "a" and len(rec) >= 4 and isinstance(rec[1], int) and isinstance(rec[2], str):
                slot, path = rec[1], rec[2]
                self._followed[(path, str(rec[3]))] = slot
                self._placeholders(slot + 1)
                if self.slots[slot].error == GONE:
                    self._unbound[slot] = path

    async def load_followed(self) -> bool:
        """Read the arrays of the slots other workers gave out and this one has not bound (their
        chunk inodes then mean the same chunks here); True if one was bound."""
        bound = False
        for slot, path in list(self._unbound.items()):  # (left there while read: a request meanwhile reads it too)
            try:
                await self.node(path)
            except OSError:
                pass
            self._unbound.pop(slot, None)
            bound = bound or self.slots[slot].error != GONE
        return bound

    def records(self) -> list[list[Any]]:
        """What ``restore`` needs, as ledger records (rewriting the ledger): the slots bound,
        and those a dead worker gave out that are not read yet."""
        return [["a", arr.slot, arr.path] for arr in self.slots if arr.error != GONE] + [
            ["a", slot, path] for path, slot in self._reserved.items()]

    def _in_image(self, path: str) -> bool:
        """True if the array at ``path`` is in an OME-Zarr image or label group, as last read
        (no I/O: the group is re-read whenever it is looked at, and its arrays follow)."""
        parent = self._groups.get(path.rpartition("/")[0]) if path else None
        return parent is not None and parent.image

    def moved(self, old: str, new: str) -> None:
        """The node at ``old`` and all below it were renamed to ``new``: they keep their slots
        (the kernel's chunk inodes keep naming the same chunks) under their new paths."""
        below = [p for p in {*self.arrays, *self._groups} if p == old or p.startswith(old + "/")]
        for path in below:
            moved_to = new + path[len(old):]
            arr, group = self.arrays.pop(path, None), self._groups.pop(path, None)
            if arr is not None:
                arr.path = moved_to
                arr.shard_keys.clear()
                arr.covered.clear()
                arr.indexes_ahead = False
                self.arrays[moved_to] = arr
                self.ledger.note("a", arr.slot, moved_to)
            if group is not None:
                group.path = moved_to
                self._groups[moved_to] = group
        for path in [p for p in self._reserved if p == old or p.startswith(old + "/")]:  # (not read yet)
            moved_to = new + path[len(old):]
            slot = self._reserved.pop(path)
            self._reserved[moved_to] = slot
            self._unbound[slot] = moved_to
            self.ledger.note("a", slot, moved_to)

    def array(self, path: str) -> ArrayNode | None:
        """The array at ``path`` as last read (no I/O), None if none was."""
        return self.arrays.get(path)
