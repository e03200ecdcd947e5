"""What the daemon tracks of the kernel's inodes (``shardfs.kernel.inodes``), in-process: the lookup
counts (``LookupCounts``) against a dict as the model (hypothesis): counts of neighbouring
inodes share an int, counts of 15 and more live apart; every ``add``/``drop`` sequence must
answer as the dict does. And when an open may keep the kernel's pages (``KernelInodes``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget
from shardfs.base.attrs import Attr
from shardfs.kernel.inodes import KernelInodes, LookupCounts, Pages
from shardfs.kernel.pins import Pins
from shardfs.tree.nodetable import CHUNK_BASE

# a few pages of neighbours (chunk inodes and small ones), so that counts share their ints
INOS = st.sampled_from([1, 2, 15, 16, 17, CHUNK_BASE, CHUNK_BASE + 1, CHUNK_BASE + 15, CHUNK_BASE + 16,
                        CHUNK_BASE + (3 << 40) + 7])
OPS = st.lists(st.tuples(st.sampled_from(["add", "drop"]), INOS, st.integers(1, 40)), max_size=200)


@settings(max_examples=budget(300))
@given(OPS)
def test_lookup_counts_answer_as_a_dict(ops):
    counts, model = LookupCounts(), {}
    for op, ino, n in ops:
        if op == "add":
            for _ in range(n):
                counts.add(ino)
            model[ino] = model.get(ino, 0) + n
        else:
            left = max(0, model.pop(ino, 0) - n)
            if left:
                model[ino] = left
            assert counts.drop(ino, n) == left, (op, ino, n)
        for other in (1, 2, 15, 16, 17, CHUNK_BASE, CHUNK_BASE + 1, CHUNK_BASE + 15, CHUNK_BASE + 16):
            assert (other in counts) == (other in model), other


def test_a_million_consecutive_inodes_cost_little():
    import tracemalloc

    counts = LookupCounts()
    inos = [CHUNK_BASE + (5 << 40) + i for i in range(1 << 20)]
    tracemalloc.start()
    for ino in inos:
        counts.add(ino)
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert used < 12 << 20, used  # a dict of 1M inodes: about 75 MiB
    assert all(counts.drop(ino, 1) == 0 for ino in inos[:1000])


V1, V2 = Attr(CHUNK_BASE, 0o100644, 100, 1), Attr(CHUNK_BASE, 0o100644, 100, 2)


def test_an_open_that_drops_other_pages_vouches_for_none_until_the_daemon_dropped_them():
    """An open answered without ``keep_cache`` (``Pages.OTHER``) drops the kernel's pages only once
    the opening process runs on, after the reply; an open of the same version answered before
    that must not keep them (found by scripts/soak: the previous value of a chunk read for
    milliseconds after its in-place write was acknowledged). Once the daemon dropped them itself
    (``dropping``/``dropped``), with no other version read or write meanwhile, they are kept."""
    k = KernelInodes()
    k.looked_up(V1.ino)
    assert k.opened(V1) is Pages.NONE
    assert k.opened(V1) is Pages.SAME
    k.changed(V1.ino)  # an in-place write committed
    assert k.opened(V2) is Pages.OTHER
    assert k.opened(V2) is Pages.OTHER, "the first opener may not have dropped the pages yet"
    mark = k.dropping(V2.ino)
    k.dropped(V2, mark)
    assert k.opened(V2) is Pages.SAME


def test_after_a_restore_every_inode_is_held_and_its_pages_unknown_until_dropped():
    """A worker replacing a dead one knows neither the kernel's lookups nor its pages: every
    inode counts as held (a change is invalidated), and an open drops the pages (no
    ``keep_cache``, no fill) until the daemon dropped them itself; then they are kept."""
    k = KernelInodes()
    assert not k.holds(V1.ino) and k.pages(V1) is Pages.NONE
    k.restored()
    assert k.holds(V1.ino) and k.holds(V1.ino + 7)
    assert k.opened(V1) is Pages.OTHER
    assert k.opened(V1) is Pages.OTHER
    mark = k.dropping(V1.ino)
    k.dropped(V1, mark)
    assert k.opened(V1) is Pages.SAME
    k.looked_up(V2.ino)
    assert k.forget(V2.ino, 1)  # evicted: its pages went with it, but it still counts as held
    assert k.holds(V2.ino) and k.opened(V2) is Pages.OTHER


def test_pages_dropped_while_another_version_was_read_or_written_are_not_vouched_for():
    k = KernelInodes()
    k.looked_up(V1.ino)
    k.opened(V1)
    for interfere in (lambda: k.served(V1), lambda: k.changed(V1.ino)):
        mark = k.dropping(V2.ino)
        interfere()  # an old handle's READ reply, or a write, landed in the pages meanwhile
        k.dropped(V2, mark)
        assert k.opened(V2) is Pages.OTHER


def test_an_open_learns_whether_its_file_changed_while_it_ran():
    """An open whose file changed while it resolved its version may hold the older version
    while the kernel takes the new one's size (it cuts or pads what the handle reads: torn
    chunks, found by scripts/soak through a name renamed onto during the open); ``unwatch``
    says so, also with another open of the same file running beside it."""
    k = KernelInodes()
    seen = k.watch(V1.ino)
    assert k.unwatch(V1.ino, seen) is False
    first = k.watch(V1.ino)
    k.changed(V1.ino)
    second = k.watch(V1.ino)
    assert k.unwatch(V1.ino, second) is False
    assert k.unwatch(V1.ino, first) is True
    assert k.unwatch(V1.ino, k.watch(V1.ino)) is False, "a finished open's changes are forgotten"


def test_files_open_through_the_pages_hold_their_inodes_size():
    """``Pins``: while a file reading through the page cache is open on an inode, a getattr of
    it answers that file's version if the chunk's size changed, an open of it at the new size
    is refused, and a name of the chunk shows another inode (made once, then kept until the
    kernel forgets it); a version of the same size (a fold: only the mtime) changes nothing,
    nor does an inode being rewritten in place (``forfeit``), nor the last file's release."""
    p = Pins()
    assert not p, "nothing pinned, no alias shown: a listing skips it"
    old, moved, new = V1, V1._replace(mtime_ns=V1.mtime_ns + 1), V1._replace(size=V1.size + 7, mtime_ns=9)
    p.pin(1, old)
    p.pin(2, old)
    assert (p.frozen(V1.ino, moved), p.refused(V1.ino, moved), p.shown(moved)) == (moved, False, V1.ino)
    assert (p.frozen(V1.ino, new), p.refused(V1.ino, new), p.shown(new)) == (old, True, None)
    p.showing(V1.ino, 77)
    assert p.shown(new) == 77 and p.shown(old) == 77
    p.unpin(1)
    assert p.frozen(V1.ino, new) == old, "one file still open"
    p.unpin(2)
    assert (p.frozen(V1.ino, new), p.refused(V1.ino, new), p.shown(new)) == (new, False, 77)
    p.forgot(V1.ino, 76)
    assert p.shown(new) == 77, "another alias forgotten"
    p.forgot(V1.ino, 77)
    assert p.shown(new) == V1.ino
    p.pin(3, old)
    p.forfeit(V1.ino)
    assert (p.frozen(V1.ino, new), p.refused(V1.ino, new), p.shown(new)) == (new, False, V1.ino)
    p.unpin(3)  # released after its inode was forfeited: nothing left to unpin
    assert p.frozen(V1.ino, new) == new and not p

