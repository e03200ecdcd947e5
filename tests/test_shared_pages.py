"""The page-cache bookkeeping that N workers of a mount share (``shardfs.kernel.sharedpages``
over ``shardfs.kernel.pagetable``), in-process: two views of one table stand for two workers.
Each answers as one worker's ``KernelInodes``/``Pins`` do, and what one records the other sees
at once. The mounted tests are in tests/test_workers_pages.py."""

from __future__ import annotations

import os
import struct

import pytest

from shardfs.base.attrs import Attr
from shardfs.kernel import pagetable as pt
from shardfs.kernel.inodes import Pages
from shardfs.kernel.sharedpages import SharedInodes, SharedPins
from shardfs.tree.nodetable import CHUNK_BASE

V1, V2 = Attr(CHUNK_BASE, 0o100644, 100, 1), Attr(CHUNK_BASE, 0o100644, 100, 2)
BIG = V1._replace(size=107, mtime_ns=9)


@pytest.fixture
def fd():
    fd = pt.memory()
    yield fd
    os.close(fd)


def worker(fd: int) -> tuple[SharedInodes, SharedPins]:
    table = pt.PageTable(fd)
    return SharedInodes(table), SharedPins(table)


def test_one_worker_keeps_fills_and_drops_as_the_one_worker_classes(fd):
    k, _ = worker(fd)
    k.looked_up(V1.ino)  # (the kernel opens what it looked up)
    assert k.pages(V1) is Pages.NONE
    assert k.opened(V1) is Pages.NONE
    assert k.opened(V1) is Pages.SAME
    k.changed(V1.ino)  # an in-place write committed
    assert k.opened(V2) is Pages.OTHER
    assert k.opened(V2) is Pages.OTHER, "the first opener may not have dropped the pages yet"
    mark = k.dropping(V2.ino)
    k.dropped(V2, mark)
    assert k.opened(V2) is Pages.SAME
    for interfere in (lambda: k.served(V1), lambda: k.changed(V1.ino), lambda: k.invalidated(V1.ino)):
        mark = k.dropping(V2.ino)
        interfere()  # an old handle's READ reply, or a write, landed in the pages meanwhile
        k.dropped(V2, mark)
        assert k.opened(V2) is Pages.OTHER
    seen = k.watch(V1.ino)
    assert not k.unwatch(V1.ino, seen)
    k.changed(V1.ino)
    assert k.unwatch(V1.ino, seen)


def test_what_one_worker_records_the_other_sees(fd):
    (a, _), (b, _) = worker(fd), worker(fd)
    a.looked_up(V1.ino)
    assert a.opened(V1) is Pages.NONE  # a fills the pages with V1
    assert b.pages(V1) is Pages.SAME and b.opened(V1) is Pages.SAME, "b keeps them"
    assert b.opened(V2) is Pages.OTHER, "and drops them for another version"
    seen = a.watch(V1.ino)
    b.invalidated(V1.ino)  # the owner committed a write to it
    assert a.unwatch(V1.ino, seen), "an open running in a sees the change made in b"
    mark = b.dropping(V2.ino)
    b.dropped(V2, mark)
    assert a.opened(V2) is Pages.SAME
    a.changed(V2.ino)  # a file opened for writing in a
    assert b.opened(V2) is Pages.OTHER
    assert b.pages(V2._replace(ino=V1.ino + 1)) is Pages.NONE, "another inode: nothing known"


def test_a_forget_taking_every_workers_lookups_is_an_eviction_whichever_worker_it_reaches(fd):
    """The kernel's lookups are counted from both workers' replies: a FORGET of all of them,
    given to either, says the kernel evicted the inode with its pages (the next open fills
    them); one that leaves some (a lookup answered since) says nothing; an invalidation of an
    evicted inode marks nothing (it has no pages)."""
    (a, _), (b, _) = worker(fd), worker(fd)
    a.looked_up(V1.ino)
    b.looked_up(V1.ino)
    assert a.opened(V1) is Pages.NONE
    b.kernel_forgot([(V1.ino, 1)])  # (not all: the kernel still holds the other)
    assert b.opened(V1) is Pages.SAME
    b.kernel_forgot([(V1.ino, 1)])
    assert a.pages(V1) is Pages.NONE and b.pages(V2) is Pages.NONE
    b.invalidated(V1.ino)  # a fold after the eviction: nothing cached to mark
    a.looked_up(V1.ino)
    assert a.opened(V2) is Pages.NONE
    a.looked_up(V1.ino)
    b.kernel_forgot([(V1.ino, 1)])  # the eviction's FORGET served after a lookup of the new inode
    assert a.opened(V2) is Pages.SAME, "kept: the new inode's pages are V2's, from its open"


def test_files_of_two_versions_open_at_once_read_the_second_directly(fd):
    """A file reading V1 through the pages in worker a: a V2 open in b must bypass them (direct
    I/O), and b's drop must not vouch for V2 while a's file can still land V1 bytes in them
    (its READ answered by a after b dropped): only once it is released."""
    (a, _), (b, _) = worker(fd), worker(fd)
    a.opened(V1)
    assert a.reading(V1, 1) is False
    assert b.reading(V1, 2) is False, "the same version: both through the pages"
    mark = b.dropping(V2.ino)
    b.dropped(V2, mark)
    assert b.opened(V2) is Pages.OTHER, "not vouched for while V1 files read through the pages"
    assert b.reading(V2, 3) is True
    b.unread(V2, 3)  # (direct: never counted)
    a.unread(V1, 1)
    b.unread(V1, 2)
    a.unread(V1, 1)  # released twice (followed, then its own release): counted once
    mark = b.dropping(V2.ino)
    b.dropped(V2, mark)
    assert b.opened(V2) is Pages.SAME
    assert a.reading(V2, 4) is False


def test_pins_are_the_mounts(fd):
    """``Pins`` as one worker's (tests/test_inodes.py), with the pins made in either worker."""
    (ka, a), (kb, b) = worker(fd), worker(fd)
    old, moved, new = V1, V1._replace(mtime_ns=V1.mtime_ns + 1), BIG
    assert not a and not b
    ka.reading(old, 1)
    a.pin(1, old)
    kb.reading(old, 2)
    b.pin(2, old)
    assert b and a
    assert (b.frozen(V1.ino, moved), b.refused(V1.ino, moved), b.shown(moved)) == (moved, False, V1.ino)
    assert (b.frozen(V1.ino, new), b.refused(V1.ino, new), b.shown(new)) == (old, True, None)
    b.showing(V1.ino, 77)
    assert b.shown(new) == 77 and b.shown(old) == 77
    a.unpin(1)
    assert b.frozen(V1.ino, new) == old, "one file still open"
    b.unpin(2)
    assert (a.frozen(V1.ino, new), a.refused(V1.ino, new), a.shown(new)) == (new, False, V1.ino)
    a.pin(3, old)
    b.forfeit(V1.ino)  # rewritten in place (the owner)
    assert (a.frozen(V1.ino, new), a.refused(V1.ino, new)) == (new, False)
    a.unpin(3)  # released after its inode was forfeited: nothing left to unpin
    a.pin(4, old)
    assert b.refused(V1.ino, new), "a forfeit is not carried over to later files"
    a.unpin(4)
    assert not a and a.table.pins() == 0


def test_a_file_opened_after_an_in_place_write_pins_its_own_size_beside_readers_of_the_old(fd):
    """Files reading V1 through the pages (worker a) no longer pin the inode once it is
    rewritten in place (``forfeit``, worker b); a file opened at the written version beside them
    (with direct I/O) pins its own size, not theirs: a getattr answers its size, an open of it is
    not refused (a 2-worker soak: tensorstore's ``fstat`` of a blosc chunk gave the old size for as
    long as a zarr 2.18 reader of the old one read, "Invalid blosc-compressed data")."""
    (ka, a), (kb, b) = worker(fd), worker(fd)
    assert ka.reading(V1, 1) is False
    a.pin(1, V1)
    b.forfeit(V1.ino)
    assert kb.reading(BIG, 2) is True, "beside a reader of V1: direct I/O"
    b.pin(2, BIG)
    assert (a.frozen(V1.ino, BIG), a.refused(V1.ino, BIG), a.shown(BIG)) == (BIG, False, V1.ino)
    assert (b.frozen(V1.ino, V1), b.refused(V1.ino, V1)) == (BIG, True)
    b.unpin(2)
    ka.unread(V1, 1)
    a.unpin(1)
    assert not a and a.table.pins() == 0


def test_an_entry_torn_by_a_dying_worker_is_poisoned(fd):
    """A worker killed while it wrote an entry: the next lock holder finds it named in the
    header and makes it read with direct I/O for good (never kept, never filled)."""
    (a, _), (b, _) = worker(fd), worker(fd)
    a.opened(V1)
    off = a.table.find(V1.ino)
    with a.table.locked():
        struct.pack_into("<Q", a.table._map, 8, off)  # what a write names before it starts
        a.table._map[off + 16:off + 20] = b"\xff" * 4  # ... and half of it
    assert b.opened(V1) is Pages.OTHER
    assert b.reading(V1, 1) is True
    mark = b.dropping(V1.ino)
    b.dropped(V1, mark)
    assert a.opened(V1) is Pages.OTHER and a.reading(V1, 2) is True


def test_a_full_table_answers_as_if_pages_of_another_version_were_held(fd, monkeypatch):
    monkeypatch.setattr(pt, "PROBES", 2)
    k, _ = worker(fd)
    inos = [V1._replace(ino=V1.ino + i * k.table.capacity) for i in range(3)]  # (one home)
    assert [k.opened(v) for v in inos] == [Pages.NONE, Pages.NONE, Pages.OTHER]
    assert [k.reading(v, i) for i, v in enumerate(inos)] == [False, False, True]


def test_a_file_released_through_another_worker_is_uncounted_there_at_once(fd):
    """Worker a opened the file (a reader, a pin) and worker b serves its RELEASE: its reader
    and pin are gone at once (an open of another version is not given direct I/O), and a's own
    let-go, when it learns of the release, takes nothing more off."""
    (ka, a), (kb, b) = worker(fd), worker(fd)
    t = ka.table
    assert ka.opened(V1) is Pages.NONE and ka.reading(V1, 5) is False
    a.pin(5, V1)
    off = t.find(V1.ino)
    assert (t.fields(off)[7:9], t.pins()) == ((1, 1), 1)  # (readers, pins)
    with kb.locked():
        kb.released_elsewhere(5)
        b.released_elsewhere(5)
    assert (t.fields(off)[7:9], t.pins()) == ((0, 0), 0)
    assert kb.reading(BIG, 6) is False, "nobody reads the other version any more"
    with ka.locked():  # (a follows the release it did not serve)
        ka.unread(V1, 5)
        a.unpin(5)
    assert (t.fields(off)[7:9], t.pins()) == ((1, 0), 0)  # (BIG's reader)
    with kb.locked():
        kb.released_elsewhere(5)  # (a release served twice: nothing more either)
    assert t.fields(off)[7] == 1


def test_the_openers_let_go_has_something_to_uncount_only_until_another_worker_released_it(fd):
    """``counts`` (read without the lock: the opener's let-go takes the lock only if it is True):
    a file's reader and pin noted in its handle's place count until the worker serving its
    RELEASE takes them; a file whose place another handle holds is counted by its opener alone,
    and stays so."""
    (ka, a), (kb, b) = worker(fd), worker(fd)
    shares_5 = 5 + pt.HANDLES  # (handle 5's place)
    assert ka.opened(V1) is Pages.NONE and ka.reading(V1, 5) is False and ka.reading(V1, shares_5) is False
    a.pin(5, V1)
    a.pin(shares_5, V1)
    assert [ka.counts(5), a.counts(5), ka.counts(shares_5), a.counts(shares_5)] == [True] * 4
    assert [kb.counts(5), b.counts(5)] == [True, True], "noted for any worker"
    with kb.locked():
        for fh in (5, shares_5):
            kb.released_elsewhere(fh)
            b.released_elsewhere(fh)
    assert [ka.counts(5), a.counts(5)] == [False, False]
    assert [ka.counts(shares_5), a.counts(shares_5)] == [True, True]
    assert [ka.counts(6), a.counts(6)] == [False, False], "a file never counted"


def test_a_handles_place_torn_by_a_dying_worker_is_forgotten(fd):
    """A worker killed while it noted a handle: the next lock holder forgets the place (the
    file stays counted, as a dead worker's; never another entry uncounted by a torn note)."""
    (ka, _), (kb, _) = worker(fd), worker(fd)
    assert ka.opened(V1) is Pages.NONE and ka.reading(V1, 5) is False
    t = ka.table
    at = t._handles_at + 5 * struct.calcsize("<QII")
    with t:
        struct.pack_into("<Q", t._map, 8, at)  # what a write names before it starts
        t._map[at + 8:at + 12] = b"\xff" * 4  # ... and half of it: an offset no entry has
    with kb.locked():
        kb.released_elsewhere(5)
    off = t.find(V1.ino)
    assert t.fields(off)[7] == 1 and t._map[at:at + 16] == bytes(16)
