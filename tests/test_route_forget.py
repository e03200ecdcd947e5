"""Which lookups a worker of ``-o workers=N`` forgets when the kernel's FORGET reaches it
(``shardfs.kernel.route.Route.forget``), in-process: each worker counts the lookups of the
replies it made, so a FORGET reaching one that counted none of an inode's lookups must free
nothing there (found by tests/test_workers_pages.py: a temporary renamed onto a chunk, its
inode freed by the other worker while the kernel still showed it, gave ENOENT at its next open).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from shardfs.app.compose import compose_tree
from shardfs.kernel.owner import OWNER, Areas, Marks
from shardfs.kernel.route import Route
from shardfs.storage.local import LocalStorage
from shardfs.tree.ledger import Ledger, memory
from shardfs.tree.nodetable import ROOT_INODE, NodeTable

@pytest.fixture
def src(tmp_path) -> Path:
    import zarr

    root = tmp_path / "src"
    a = zarr.open_group(str(root), mode="w").create_array("a", shape=(4, 4), chunks=(2, 2), shards=(4, 4),
                                                            dtype="<i4", fill_value=0)
    a[...] = 1
    return root


HELD = {9: 0, 10: 1, 11: 3}  # this worker's lookups of each inode
FORGETS = [(9, 1), (10, 2), (11, 2)]


class Sent:
    """The links of ``Route`` (``Peers.link``), keeping what each is sent."""

    def __init__(self) -> None:
        self.forgets: dict[int, list[tuple[int, int]]] = {}

    def link(self, slot: int) -> "Sent.Link":
        return Sent.Link(self, slot)

    class Link:
        def __init__(self, sent: "Sent", slot: int) -> None:
            self.sent, self.slot = sent, slot

        def send_forget(self, forgets: list[tuple[int, int]]) -> None:
            self.sent.forgets.setdefault(self.slot, []).extend(forgets)


def route(index: int, writable: bool, tmp_path) -> tuple[Route, Sent]:
    sent = Sent()
    areas = Areas(NodeTable([]), Marks(str(tmp_path / "marks"))) if writable else None
    return Route(index, lambda fh: fh % 2, sent, areas, None, None,  # type: ignore[arg-type]  # Sent: the links it uses
                 lambda ino: None), sent


def test_the_owner_forgets_every_lookup_itself(tmp_path):
    r, sent = route(OWNER, True, tmp_path)
    assert r.forget(FORGETS, HELD.__getitem__) == FORGETS
    assert sent.forgets == {}


def test_another_worker_gives_the_owner_what_it_did_not_count_and_frees_only_what_it_counted(tmp_path):
    r, sent = route(1, True, tmp_path)
    assert r.forget(FORGETS, HELD.__getitem__) == [(10, 2), (11, 2)]
    assert sent.forgets == {OWNER: [(9, 1), (10, 1)]}


def test_a_read_only_mounts_worker_frees_only_what_it_counted(tmp_path):
    r, sent = route(1, False, tmp_path)
    assert r.forget(FORGETS, HELD.__getitem__) == [(10, 2), (11, 2)]
    assert sent.forgets == {}


def test_an_alias_another_worker_made_is_sent_to_its_maker_and_frees_nothing_here(tmp_path):
    """Each worker shows its own aliases (``shardfs.kernel.pins``), so only the maker of one
    counts the kernel's lookups of it: of a FORGET reaching another worker, what it did not
    count of such an alias goes to its maker (``made_by``: its number names it), the owner's
    share of the rest to the owner; the owner frees none of it."""
    r, sent = route(1, True, tmp_path)
    r.made_by = {9: 2}.get
    assert r.forget(FORGETS, HELD.__getitem__) == [(10, 2), (11, 2)]
    assert sent.forgets == {2: [(9, 1)], 0: [(10, 1)]}
    owner, sent = route(OWNER, True, tmp_path)
    owner.made_by = {9: 1}.get
    assert owner.forget(FORGETS, HELD.__getitem__) == FORGETS
    assert sent.forgets == {1: [(9, 1)]}


def test_a_worker_forgets_every_lookup_of_an_alias_it_made_even_those_it_did_not_count(tmp_path):
    """A worker that replaced a dead one in its slot counted none of the kernel's lookups of
    the aliases the dead one made, which are now its own (``made_by``): a FORGET of one reaching
    it is forgotten here whole, never given to the owner (which frees no alias of another
    worker: the alias would never be freed)."""
    r, sent = route(1, True, tmp_path)
    r.made_by = {9: 1}.get
    assert r.forget(FORGETS, HELD.__getitem__) == [(9, 1), (10, 2), (11, 2)]
    assert sent.forgets == {0: [(10, 1)]}


def _workers(src: Path, fd: int, indexes: tuple[int, ...]) -> list:
    """Node trees of workers ``indexes`` of two sharing the ledger in memfd ``fd``."""
    trees = []
    for index in indexes:
        ledger = Ledger(fd=os.dup(fd))
        ledger.share(index, 2)
        ledger.start()
        trees.append(compose_tree(LocalStorage(str(src)), ledger=ledger))
    return trees


async def _chunk(tree) -> int:
    arr = await tree.names.lookup(ROOT_INODE, "a")
    return (await tree.names.lookup(arr.ino, "1.1")).ino


def _gone(tree, ino: int) -> None:
    """``ino`` means nothing to ``tree`` once it followed the ledger: ENOENT."""
    tree.numbers.ledger.catch_up()
    with pytest.raises(OSError) as e:
        tree.nodes.node_key(ino)
    assert e.value.errno == errno.ENOENT


def test_only_the_worker_that_made_an_alias_frees_it(src):
    """Two workers' node tables on one ledger: an alias worker 1 made (``new_alias``) is known
    to worker 0 once it follows, and worker 0's ``forget`` of it frees nothing (the kernel's
    FORGET of one lookup of many: worker 1 still shows it); worker 1's frees it, for both."""
    fd = memory()
    try:
        trees = _workers(src, fd, (0, 1))
        ino = trio.run(_chunk, trees[1])
        aliases = [trees[1].nodes.new_alias(ino) for _ in range(3)]
        trio.run(_chunk, trees[0])
        trees[0].numbers.ledger.catch_up()
        assert [trees[w].nodes.made_by(a) for w in (0, 1) for a in aliases] == [1] * 6
        assert trees[0].nodes.made_by(ino) is None
        alias = aliases[0]
        assert trees[0].nodes.forget(alias) is None
        assert trees[0].nodes.node_key(alias) == trees[0].nodes.node_key(ino)
        assert trees[1].nodes.forget(alias) == ino
        _gone(trees[0], alias)
    finally:
        os.close(fd)


def test_a_worker_knows_the_maker_of_an_alias_it_never_followed(src):
    """The kernel's FORGET of an alias may reach a worker that has not followed the ledger since
    another made it (it read nothing meanwhile): ``made_by`` looks for the number in the ledger
    first, so the FORGET goes to the maker (not followed, the number meant nothing here, and the
    FORGET was dropped: the alias freed by no worker)."""
    fd = memory()
    try:
        trees = _workers(src, fd, (0, 1))
        trio.run(_chunk, trees[0])
        alias = trees[1].nodes.new_alias(trio.run(_chunk, trees[1]))
        assert trees[0].nodes.made_by(alias) == 1
        assert trees[0].nodes.made_by(alias + 1) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("bound", [True, False], ids=["its-array-read", "its-array-not-read-yet"])
def test_the_worker_that_replaced_an_aliass_dead_maker_frees_it(src, bound):
    """Worker 1 makes an alias and dies; the worker that replaces it in slot 1 takes over the
    ledger's records (``restore``) and, the alias's number naming slot 1, frees it when the
    kernel forgets it (before, no worker knew it as its own: its inode and table entries were
    never freed), whether or not it read the alias's array since; worker 0 then knows it no more.
    So with a temporary the dead worker committed onto a chunk (any worker frees it)."""
    fd = memory()
    try:
        first, dead = _workers(src, fd, (0, 1))
        ino = trio.run(_chunk, dead)
        alias = dead.nodes.new_alias(ino)
        slot = dead.hierarchy.arrays["a"].slot
        dead.numbers.ledger.note("u", 10**6, "c", slot, [1, 0])  # a temporary renamed onto chunk 1.0
        trio.run(_chunk, first)
        (successor,) = _workers(src, fd, (1,))
        trio.run(successor.numbers.restore, successor.numbers.ledger.records())
        if bound:
            assert trio.run(_chunk, successor) == ino
        assert successor.nodes.made_by(alias) == 1 and first.nodes.made_by(alias) == 1
        assert successor.nodes.made_by(10**6) is None
        assert first.nodes.forget(alias) is None
        assert successor.nodes.forget(alias) == (ino if bound else None)
        successor.nodes.forget(10**6)  # (the one that committed it died: any worker frees it)
        _gone(first, alias)
        _gone(first, 10**6)
        if not bound:
            assert trio.run(_chunk, successor) == ino
        _gone(successor, alias)
        _gone(successor, 10**6)
    finally:
        os.close(fd)
