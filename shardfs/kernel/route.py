"""Which worker serves a request of a mount with ``-o workers=N``.

The kernel gives each request to whichever worker reads it first. A worker serves it itself
unless another must:

- a request on a handle (``HANDLED``: read, release, flush, readdir, releasedir) goes to the
  worker that opened that handle (its number says which: ``Ledger.owner``). That worker serves
  the version it opened; any other would have to open the file again, and if the chunk was
  rewritten or removed since (another mount, another writer of the source), it could only
  answer EIO (never another version's bytes). Only the worker of the slot answers: a dead one's
  successor in that slot takes its handles over from the ledger (``Reopen.restore``: opened
  again at their first use, as with one worker), and a link to a slot whose worker died waits
  for the next one (``PeerLink``). A read or release of an unchanged file is served where it
  arrives (``here``), and the release of a read handle without a look at the handle at all: its
  release anywhere only notes it in the ledger (its opener lets go when it follows that), and
  every file handle of a read-only mount, and every one a writable mount's worker other than
  the owner opened, is one (a file opened for writing is the owner's: ``Areas.forwards``), and
  so is every one the owner opened while it has marked nothing (``Areas.unmarked``: an open for
  writing marks its area first);
  learning the handle first (following the ledger) cost about a tenth of the daemon's CPU a chunk
  file read with 2 workers;
- on a writable mount, what the owner worker must serve (``shardfs.kernel.owner.Areas``: every
  change, every request about what was changed through the mount) goes to it; the owner marks
  the area of each change before it starts it (``Areas.before``), whoever sent the request;
- on a read-only mount of a remote source, a chunk's lookup, getattr and open go to the home of
  its shard (``shardfs.kernel.homes``), which alone fetches, caches and reads ahead that shard.

A request another worker forwarded is served where it arrives: it was sent to the worker that
must serve it (only the owner is sent what ``Areas`` names, and only the opener a request on
its handle), so nothing is forwarded twice.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from shardfs.kernel.forward import PeerLink, Peers
from shardfs.kernel.homes import Homes
from shardfs.kernel.owner import HANDLED, OWNER, Areas


class Route:
    """The routing of worker ``index`` (of a shared ledger's workers): ``owner_of(fh)``, the
    slot that opened handle ``fh``; ``peers``, its links to the others; ``areas``, on a
    writable mount, the owner's marks and what the others forward to it; ``homes``, on a
    read-only mount of a remote source, the homes of chunks' shards."""

    def __init__(self, index: int, owner_of: Callable[[int], int], peers: Peers, areas: Areas | None,
                 here: Callable[[int], int | None] | None, homes: Homes | None,
                 made_by: Callable[[int], int | None]) -> None:
        """``here(fh)``: the inode of another worker's read handle ``fh`` if a read or release of
        it may be served here, else None (``Reopen.here``: opened again at its version;
        ``Elsewhere`` if it changed); ``made_by(ino)``: the worker whose
        alias ``ino`` is, or None (``NodeTable.made_by``)."""
        self.index, self.owner_of, self.peers, self.areas = index, owner_of, peers, areas
        self.here = here
        self.homes = homes
        self.made_by = made_by

    def link(self, op: str, args: tuple[Any, ...]) -> PeerLink | None:
        """The link to the worker that must serve request ``op(*args)``, or None: served here
        (the owner has marked what it is about to change: ``OSError`` if it could not)."""
        areas = self.areas
        if areas is not None:
            if self.index == OWNER:
                areas.before(op, args)
            elif areas.forwards(op, args):
                return self.peers.link(OWNER)
        if self.homes is not None:
            home = self.homes.of(op, args)
            if home is not None and home != self.index:
                return self.peers.link(home)
        if op in HANDLED:
            slot = self.owner_of(args[0])
            if slot == self.index or (op == "release" and (areas is None or slot != OWNER or areas.unmarked())):
                return None  # (a read handle)
            if not (op in ("read", "release") and self._here(slot, args[0])):
                return self.peers.link(slot)
        return None

    def unknown(self, op: str, args: tuple[Any, ...]) -> bool:
        """True if ``link`` sends ``op(*args)`` to the owner only because this worker does not
        know the inode it names yet (``Areas.unknown``): learn the other workers' numbers first."""
        return self.index != OWNER and self.areas is not None and self.areas.unknown(op, args)

    def _here(self, slot: int, fh: int) -> bool:
        """A read handle of a live worker, which this one has opened again, or can, at its
        version; of a writable mount's owner only in an area it never marked (no pending chunk,
        which only the owner knows: the handle was opened at a version the source shows or
        showed, and ``Reopen.live`` checks which)."""
        ino = None if self.here is None else self.here(fh)
        if ino is None:
            return False
        return self.areas is None or slot != OWNER or not self.areas.changed(ino)

    def opener(self, fh: int) -> PeerLink:
        """The link to the worker that opened handle ``fh`` (``Elsewhere``)."""
        return self.peers.link(self.owner_of(fh))

    def forget(self, forgets: Sequence[tuple[int, int]], lookups: Callable[[int], int]) -> Sequence[tuple[int, int]]:
        """A FORGET reached this worker: of each inode, the lookups it did not count (``lookups``:
        its own replies') are the owner's to forget (a writable mount's, from another worker: it
        frees committed temporaries and aliases); the forgets this worker makes itself. Each
        worker counts the lookups of the replies it made (a forwarded request's, the serving
        worker: ``Operations.counted``); a worker other than the owner frees nothing it counted
        none of: an alias the owner gave the kernel, freed here, was gone for every worker while
        the kernel still showed it (ENOENT at its next open). An alias a worker made (``made_by``)
        is its maker's alone, which counted every lookup of it (or its predecessor in its slot
        did) and frees it: what another worker did not count of one is sent to its maker (an alias
        the owner freed while its maker still showed it was ENOENT at the next stat of its name),
        and its maker forgets all of it."""
        made_by, index = self.made_by, self.index  # (every FORGET: an alias is rare, its test a dict's)
        here: list[tuple[int, int]] = []
        owners: list[tuple[int, int]] = []  # (of a writable mount's worker other than the owner)
        makers: dict[int, list[tuple[int, int]]] = {}
        for ino, n in forgets:
            maker = made_by(ino)
            if maker == index:
                here.append((ino, n))
                continue
            h = lookups(ino)
            if h < n:
                if maker is not None:
                    makers.setdefault(maker, []).append((ino, n - h))
                elif index != OWNER and self.areas is not None:
                    owners.append((ino, n - h))
            if h or index == OWNER:
                here.append((ino, n))
        for slot, theirs in makers.items():
            self.peers.link(slot).send_forget(theirs)
        if owners:
            self.peers.link(OWNER).send_forget(owners)
        return here

    @property
    def forwarded(self) -> dict[str, int]:
        """Requests sent to other workers, by operation (``shardfs status``)."""
        return dict(self.peers.forwarded)
