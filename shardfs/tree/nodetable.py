"""The node-key table: which node key (``shardfs.tree.nodes``) each inode number shows, and back.

Contract: directory, metadata and key-directory keys get an inode on first use
(``inode``) and keep it for the mount's life (``rebind`` moves one to a new key);
chunk inodes are computed, never stored: ``CHUNK_BASE`` + the array's slot
(``slots``, owned by the ``Hierarchy`` and shared here by reference) << ``SLOT_SHIFT`` + the
chunk's C-order position. Staging files (a writer's temporaries, ``Staging``) get
an inode each; one committed onto a node shows that node's key and is an alias of
its inode until the kernel forgets it (``forget``), as is a ``new_alias``. Unknown inodes are ENOENT.
Every inode given out is noted in the ``Ledger`` (``shardfs.tree.ledger``), so that a worker
serving the same kernel connection after this one died gives the same numbers the same
meaning (``restore``). Runs on the trio thread; no I/O but the ledger's appends.
With ``-o workers=N`` the ledger is shared: a node key gets its inode under the ledger's lock,
after learning what the other workers gave out (``follow``), so every worker gives a key the
same number and a number means the same key in every worker.
"""

from __future__ import annotations

import dataclasses
import errno

from typing import Any

from shardfs.base.attrs import fail
from shardfs.tree.ledger import Ledger
from shardfs.tree.nodes import (GONE, ArrayNode, ChunkKey, DirKey, InnerShardKey, KeyDirKey, MetaKey, NodeKey,
                                ShardDirKey, Staging, StagingKey, Unbound)
from shardfs.writes.spill import SpillBuffer

ROOT_INODE = 1
CHUNK_BASE = 1 << 62
SLOT_SHIFT = 40


class NodeTable:
    """Inode numbers <-> node keys for one mount; ``slots``: the arrays by slot; ``unbound``:
    the slots given out whose array is not read here yet, and its path (``Hierarchy.unbound``)."""

    def __init__(self, slots: list[ArrayNode], ledger: Ledger | None = None,
                 unbound: dict[int, str] | None = None) -> None:
        self._slots = slots
        self._unbound: dict[int, str] = {} if unbound is None else unbound
        # records of a dead (or another) worker that name a chunk of a slot not bound here yet:
        # applied when it is (``slot_bound``); slot -> inode -> record, and inode -> slot
        self._deferred: dict[int, dict[int, list[Any]]] = {}
        self._deferred_at: dict[int, int] = {}
        # inodes a dead worker gave a chunk of a slot that has no array here (``GONE``: deleted,
        # or re-laid out by a resize): ESTALE, so the kernel looks their names up again; inode -> record
        self._stale: dict[int, list[Any]] = {}
        self.ledger = ledger or Ledger()
        self._keys: dict[int, NodeKey] = {ROOT_INODE: DirKey("")}
        self._inos: dict[NodeKey, int] = {DirKey(""): ROOT_INODE}
        self.staged: dict[tuple[int, str], Staging] = {}  # (directory inode, name) -> staging file
        self._tmp: dict[int, Staging] = {}
        self._aliases: dict[int, set[int]] = {}
        self._committed: set[int] = set()  # a dead worker's staging inodes committed onto a node (in ``_keys``)
        # a dead worker's staging files, their bytes lost with it: (directory inode, name) -> inode (EIO)
        self.lost: dict[tuple[int, str], int] = {}
        self._lost_inos: set[int] = set()
        self._top = ROOT_INODE  # the highest inode number given out (by any worker)
        self.ledger.followers.append(self.follow)

    def _new_ino(self) -> int:
        self._top += 1
        return self._top

    def _ino(self, key: NodeKey) -> int:
        ino = self._inos.get(key)
        if ino is None:
            with self.ledger.locked():  # (a shared ledger: another worker may have given it one)
                ino = self._inos.get(key)
                if ino is None:
                    ino = self._new_ino()
                    self._keys[ino] = key
                    self._inos[key] = ino
                    self.ledger.note("k", ino, *_encode(key))
        return ino

    def node_key(self, ino: int) -> NodeKey:
        """The node inode ``ino`` shows; ENOENT if it is unknown."""
        if ino >= CHUNK_BASE:
            slot, linear = divmod(ino - CHUNK_BASE, 1 << SLOT_SHIFT)
            if slot >= len(self._slots):
                raise fail(errno.ENOENT)
            arr = self._slots[slot]
            if arr.info is None and slot in self._unbound:
                raise Unbound(self._unbound[slot])
            if arr.info is None and arr.error == GONE:
                # a slot a dead worker gave out that has no array here: its array was deleted, or
                # re-laid out (resized: a later slot). The kernel may still hold a name of one of its
                # chunks; ESTALE makes it look the name up again (``LOOKUP_REVAL``): ENOENT, or the
                # chunk's inode in the array's slot now (found by scripts/soak: a resize, then a
                # worker kill, then zarr 2.18 read the kept chunks as fill: EIO on their old inodes)
                raise fail(errno.ESTALE)
            return ChunkKey(arr, arr.shown.layout.coords(linear))
        if ino in self._lost_inos:
            raise fail(errno.EIO)
        if self._deferred_at and ino in self._deferred_at:
            slot = self._deferred_at[ino]
            if slot in self._unbound:
                raise Unbound(self._unbound[slot])
        st = self._tmp.get(ino)
        if st is not None:
            return st.committed or StagingKey(st)
        if ino in self._stale:
            raise fail(errno.ESTALE)  # an alias of a chunk of such a slot (a temporary renamed onto it): as above
        try:
            return self._keys[ino]
        except KeyError:
            raise fail(errno.ENOENT) from None

    def new_staging(self, parent: int, name: str, data: SpillBuffer) -> Staging:
        """Create staging file ``name`` in directory ``parent`` holding ``data`` (empty)."""
        with self.ledger.locked():  # (a shared ledger: after every number another worker gave)
            st = Staging(self._new_ino(), data, parent, name)
            self.ledger.note("t", st.ino, parent, name)
        self.forget_lost(parent, name)
        self._tmp[st.ino] = st
        self.staged[(parent, name)] = st
        return st

    def drop_staging(self, parent: int, name: str, committed: NodeKey | None) -> None:
        """Remove a staging file's name; its inode shows node key ``committed`` from now on
        (an alias of that node's inode until the kernel forgets it), if given."""
        st = self.staged.pop((parent, name))
        st.data.clear()  # gives a spill file's space back
        if committed is None:
            self._tmp.pop(st.ino, None)
            self.ledger.note("v", st.ino)
        else:
            st.committed = committed
            self._aliases.setdefault(self.inode(committed), set()).add(st.ino)
            # the kernel's dentry of the new name holds this inode: a successor must know it
            self.ledger.note("u", st.ino, *_encode(committed))

    def rename_staging(self, p1: int, n1: str, p2: int, n2: str) -> None:
        """Staging file ``n1`` of ``p1`` is now ``n2`` of ``p2`` (one there before is dropped first)."""
        st = self.staged.pop((p1, n1))
        self.staged[(p2, n2)] = st
        st.parent, st.name = p2, n2
        self.ledger.note("t", st.ino, p2, n2)
        self.forget_lost(p2, n2)

    def is_lost(self, ino: int) -> bool:
        """``ino`` is a dead worker's staging file whose bytes died with it (``lost``)."""
        return bool(self._lost_inos) and ino in self._lost_inos

    def forget_lost(self, parent: int, name: str) -> bool:
        """Forget the lost staging file ``name`` of ``parent`` (removed, or replaced); True if
        there was one."""
        ino = self.lost.pop((parent, name), None)
        if ino is None:
            return False
        self._lost_inos.discard(ino)
        return True

    def aliases(self, ino: int) -> set[int]:
        """The other inodes that show node ``ino``: staging inodes committed onto it, and for a
        chunk the inodes of the same chunk in the array's earlier layouts (``ArrayNode.lineage``:
        the kernel keeps a dentry, and the attributes of its inode, for the entry and attribute
        timeouts after a resize gave the array a new slot; a change of the chunk must drop
        those too), with their staging inodes."""
        found = set(self._aliases.get(ino, ()))
        if ino >= CHUNK_BASE:
            key = self.node_key(ino)
            assert isinstance(key, ChunkKey)
            for slot in key.arr.lineage:
                arr = self._slots[slot]
                if slot != key.arr.slot and arr.info is not None and arr.info.layout.in_grid(key.coords):
                    other = self.chunk_ino(arr, key.coords)
                    found.add(other)
                    found.update(self._aliases.get(other, ()))
        return found

    def new_alias(self, ino: int) -> int:
        """A new inode showing the node of ``ino``: an alias of it until the kernel forgets it
        (a chunk's names show one while files opened on an older size hold ``ino``: see
        ``shardfs.kernel.pins``). Of a shared ledger, its number names the worker that made it
        (``made_by``)."""
        with self.ledger.locked():  # (as ``new_staging``)
            alias = self._new_ino()
            while not self.ledger.mine(alias):  # (the numbers between stay unused)
                alias = self._new_ino()
            self._keys[alias] = self.node_key(ino)
            self.ledger.note("k", alias, *_encode(self._keys[alias]))
        self._aliases.setdefault(ino, set()).add(alias)
        return alias

    def is_new_alias(self, ino: int) -> bool:
        """True if ``new_alias`` made ``ino`` (it shows its own number, unlike a staging alias)."""
        return isinstance(self._keys.get(ino), ChunkKey)  # chunks' own inodes are computed, never here

    def made_by(self, ino: int) -> int | None:
        """The worker of a shared ledger whose ``new_alias`` ``ino`` is, or None if it is none:
        only that worker shows it (``shardfs.kernel.pins``: its aliases are its own), so only it
        counts the kernel's lookups of it and frees it (``forget``). Its number's residue says
        which, as a handle's does (``Ledger.owner``): a worker that replaced a dead one in its
        slot frees the aliases the dead one made (a record naming none left them to no worker:
        an inode and its table entries never freed). A number this worker has not seen given out
        is looked for in the other workers' records first (the FORGET of another's alias this one
        never followed, else freed by none: 3 runs in 5 of a two-worker test)."""
        if self.ledger.count == 1:
            return None
        if self._top < ino < CHUNK_BASE:  # given out by another worker since this one last looked
            self.ledger.catch_up()
        return self.ledger.owner(ino) if self._is_alias(ino) else None

    def _is_alias(self, ino: int) -> bool:
        """``ino`` is a ``new_alias`` (of any worker), its slot bound here or not (``_defer``)."""
        slot = self._deferred_at.get(ino)
        if slot is not None:
            return self._deferred[slot][ino][0] == "k"
        return ino not in self._committed and self.is_new_alias(ino)

    def forget(self, ino: int) -> int | None:
        """The kernel dropped inode ``ino``: free it if it is a committed staging file or a
        ``new_alias`` this worker made (``made_by``); the inode it was an alias of, or None."""
        slot = self._deferred_at.get(ino)
        if slot is not None:  # (named a chunk of a slot not read yet)
            if self._is_alias(ino) and not self.ledger.mine(ino):
                return None  # another worker's (``made_by``): it frees it
            del self._deferred_at[ino], self._deferred[slot][ino]
            self.ledger.note("f", ino)  # (as below, when bound: the others free it too)
            return None
        if self._stale.pop(ino, None) is not None:
            self.ledger.note("f", ino)
            return None
        st = self._tmp.get(ino)
        if st is not None and st.committed is not None:
            del self._tmp[ino]
            target = self.inode(st.committed)
        elif ino in self._committed:
            self._committed.discard(ino)
            target = self.inode(self._keys.pop(ino))
        elif self.is_new_alias(ino) and self.ledger.mine(ino):
            target = self.inode(self._keys.pop(ino))
        else:
            return None
        self.ledger.note("f", ino)  # (a successor keeps no alias the kernel forgot: ``ledger.in_effect``)
        self._aliases[target].discard(ino)
        if not self._aliases[target]:
            del self._aliases[target]
        return target

    def inode(self, key: NodeKey) -> int:
        """The inode that shows node ``key`` (allocated on first use); the inverse of ``node_key``."""
        return self.chunk_ino(key.arr, key.coords) if isinstance(key, ChunkKey) else self._ino(key)

    def rebind(self, old: NodeKey, new: NodeKey) -> int | None:
        """Make the inode of ``old`` show ``new`` (a directory made before its array existed
        becomes one of its key directories); its inode, or None if ``old`` had none or
        ``new`` has one already."""
        ino = self._inos.get(old)
        if ino is None or new in self._inos:
            return None
        del self._inos[old]
        self._keys[ino] = new
        self._inos[new] = ino
        self.ledger.note("k", ino, *_encode(new))
        return ino

    def moved(self, old: str, new: str) -> None:
        """The directory at ``old`` and all below it were renamed to ``new``: every directory and
        metadata inode below it shows the same node at its new path (the kernel moved its
        dentries with the directory)."""
        def renamed(key: NodeKey | None) -> NodeKey | None:
            if isinstance(key, (DirKey, MetaKey, ShardDirKey, KeyDirKey, InnerShardKey)) \
                    and (key.path == old or key.path.startswith(old + "/")):
                return dataclasses.replace(key, path=new + key.path[len(old):])
            return None

        for ino, key in list(self._keys.items()):
            moved = renamed(key)
            if moved is not None:
                self._keys[ino] = moved
                if self._inos.pop(key, None) == ino:
                    self._inos[moved] = ino
                self.ledger.note("u" if ino in self._committed else "k", ino, *_encode(moved))
        for st in self._tmp.values():  # staging files committed onto a metadata file there
            moved = renamed(st.committed)
            if moved is not None:
                st.committed = moved
                self.ledger.note("u", st.ino, *_encode(moved))

    def allocated(self, key: NodeKey) -> int | None:
        """The inode of a node key if the kernel may know it, else None."""
        return self._inos.get(key)

    @staticmethod
    def chunk_ino(arr: ArrayNode, coords: tuple[int, ...]) -> int:
        """The inode of inner chunk ``coords`` of ``arr`` (computed, never stored)."""
        return CHUNK_BASE + (arr.slot << SLOT_SHIFT) + arr.shown.layout.linear(coords)

    def restore(self, records: list[list[Any]]) -> None:
        """Give the inodes of ``records`` (a dead worker's ledger, its slots restored first) the
        keys they had. Its staging files lived in its memory only: their bytes are lost, and
        their names and inodes answer EIO (``lost``) until removed or replaced; but one
        committed onto a node (``["u", ino, ...]``: renamed onto a chunk or metadata file,
        whose name the kernel's dentry now shows with that inode) shows that node again, an
        alias of its inode. New inodes are numbered after every one it gave out. Records that
        make no sense now (an array slot gone) are skipped."""
        self.follow(records, dead=True)

    def follow(self, records: list[list[Any]], dead: bool = False) -> None:
        """What ``restore`` does, for the records the live workers appended meanwhile (a shared
        ledger: this one's too) but for their staging files, which live (``dead``: a dead
        worker's records, whose staging files are lost): a number only ever gets the key it
        was first noted with, or a later one a ``rebind``/``moved`` noted."""
        last = ROOT_INODE
        lost: dict[int, tuple[int, str]] = {}
        for rec in records:
            if rec[0] not in ("k", "t", "u", "v", "f") or not isinstance(rec[1], int):
                continue
            ino = rec[1]
            last = max(last, ino)
            if rec[0] == "f":  # the kernel forgot this alias (``forget``)
                self._forgotten(ino)
                lost.pop(ino, None)
                continue
            if dead and rec[0] == "t" and len(rec) == 4 and isinstance(rec[2], int) and isinstance(rec[3], str):
                lost[ino] = (rec[2], rec[3])
            elif rec[0] in ("u", "v"):
                lost.pop(ino, None)
            if rec[0] in ("k", "u") and self._defer(ino, rec):
                continue
            try:
                key = _decode(rec[2:], self._slots) if rec[0] in ("k", "u") else None
            except (IndexError, TypeError, ValueError):
                key = None
            if key is not None:
                self._stale.pop(ino, None)
                self._apply(rec[0], ino, key)
            elif rec[0] in ("k", "u") and len(rec) == 5 and rec[2] == "c":
                self._stale[ino] = rec
        self._top = max(self._top, last)
        self.lost.update({where: ino for ino, where in lost.items()})
        self._lost_inos.update(lost)

    def _forgotten(self, ino: int) -> None:
        """Drop alias ``ino`` that another worker's ``forget`` let go of (a ledger's "f" record)."""
        self._stale.pop(ino, None)
        earlier = self._deferred_at.pop(ino, None)
        if earlier is not None:
            self._deferred.get(earlier, {}).pop(ino, None)
        key = self._keys.pop(ino, None)
        self._committed.discard(ino)
        if key is None:
            return
        if isinstance(key, ChunkKey):
            target: int | None = self.chunk_ino(key.arr, key.coords)
        else:
            target = self._inos.get(key)
            if target == ino:  # (never: a forgotten inode only showed another node's)
                del self._inos[key]
                target = None
        if target is not None and target in self._aliases:
            self._aliases[target].discard(ino)
            if not self._aliases[target]:
                del self._aliases[target]

    def _apply(self, kind: str, ino: int, key: NodeKey) -> None:
        """Record ``[kind, ino, *key]`` of a ledger: ``ino`` shows ``key``."""
        old = self._keys.get(ino)
        if old is not None and not isinstance(old, ChunkKey) and self._inos.get(old) == ino:
            del self._inos[old]  # (a chunk's key is no ``_inos`` key: its alias noted again)
        self._keys[ino] = key
        if kind == "u":  # an alias of the node's inode, never the inode that shows the node
            self._committed.add(ino)
            self._aliases.setdefault(self.inode(key), set()).add(ino)
        elif not isinstance(key, ChunkKey):
            self._inos[key] = ino
        else:
            self._aliases.setdefault(self.inode(key), set()).add(ino)

    def _defer(self, ino: int, rec: list[Any]) -> bool:
        """Keep ``rec`` (a "k" or "u" record of ``ino``) until its slot is bound if it names a
        chunk of a slot not bound here yet (True); else forget an earlier one kept for ``ino``."""
        slot = rec[3] if len(rec) == 5 and rec[2] == "c" and isinstance(rec[3], int) else None
        if slot is None or slot not in self._unbound:
            earlier = self._deferred_at.pop(ino, None)
            if earlier is not None:
                self._deferred[earlier].pop(ino, None)
            return False
        self._deferred_at[ino] = slot
        self._deferred.setdefault(slot, {})[ino] = rec
        old = self._keys.pop(ino, None)  # (what ``ino`` showed before this record, if anything)
        if old is not None and self._inos.get(old) == ino:
            del self._inos[old]
        self._committed.discard(ino)
        return True

    def slot_bound(self, slot: int) -> None:
        """Slot ``slot`` has its array now (``Hierarchy.bound``): apply the records kept for it."""
        for ino, rec in self._deferred.pop(slot, {}).items():
            if self._deferred_at.get(ino) != slot:
                continue
            del self._deferred_at[ino]
            try:
                key = _decode(rec[2:], self._slots)
            except (IndexError, TypeError, ValueError):
                key = None
            if key is not None:
                self._apply(rec[0], ino, key)

    def records(self) -> list[list[Any]]:
        """What ``restore`` needs, as ledger records (rewriting the ledger): the keys, the
        committed staging files, the live staging files' inodes (never to be reused), and the
        records kept for slots not bound yet."""
        out = [["u" if ino in self._committed else "k", ino, *_encode(key)]
               for ino, key in self._keys.items() if ino != ROOT_INODE]
        for st in self._tmp.values():
            out.append(["t", st.ino, st.parent, st.name] if st.committed is None
                       else ["u", st.ino, *_encode(st.committed)])
        out += [["t", ino, parent, name] for (parent, name), ino in self.lost.items()]
        out += [rec for slot, kept in self._deferred.items() if slot in self._unbound
                for ino, rec in kept.items() if self._deferred_at.get(ino) == slot]
        out += list(self._stale.values())
        return out


def _encode(key: NodeKey) -> list[Any]:
    """A directory, metadata or chunk key as ledger fields (``_decode`` reads them back)."""
    if isinstance(key, DirKey):
        return ["d", key.path]
    if isinstance(key, MetaKey):
        return ["m", key.path, key.name]
    if isinstance(key, ShardDirKey):
        return ["s", key.path, key.rel]
    if isinstance(key, KeyDirKey):
        return ["p", key.path, list(key.prefix)]
    if isinstance(key, InnerShardKey):
        return ["i", key.path, key.level, list(key.box)]
    if isinstance(key, ChunkKey):
        return ["c", key.arr.slot, list(key.coords)]
    raise TypeError(f"no ledger form for {key!r}")


def _decode(fields: list[Any], slots: list[ArrayNode]) -> NodeKey | None:
    """The key ``_encode`` wrote as ``fields``; None for a chunk of a slot not restored."""
    kind = fields[0]
    if kind == "d":
        return DirKey(str(fields[1]))
    if kind == "m":
        return MetaKey(str(fields[1]), str(fields[2]))
    if kind == "s":
        return ShardDirKey(str(fields[1]), str(fields[2]))
    if kind == "p":
        return KeyDirKey(str(fields[1]), tuple(int(i) for i in fields[2]))
    if kind == "i":
        return InnerShardKey(str(fields[1]), int(fields[2]), tuple(int(i) for i in fields[3]))
    if kind == "c" and int(fields[1]) < len(slots) and slots[int(fields[1])].info is not None:
        return ChunkKey(slots[int(fields[1])], tuple(int(i) for i in fields[2]))
    return None
