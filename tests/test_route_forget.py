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
    return Route(index, lambda fh: fh % 2, sent, areas, None, None, 2,  # type: ignore[arg-type]  # Sent: the links it uses
                 lambda ino: False), sent


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


def test_an_alias_another_worker_made_is_sent_to_every_other_worker_and_frees_nothing_here(tmp_path):
    """Each worker shows its own aliases (``shardfs.kernel.pins``), so only the maker of one
    counts the kernel's lookups of it: of a FORGET reaching another worker, what it did not
    count of such an alias goes to every other worker (it does not know which made it), the
    owner's share of the rest to the owner; the owner frees none of it."""
    aliases = {9}
    r, sent = route(1, True, tmp_path)
    r.count, r.made_elsewhere = 3, aliases.__contains__
    assert r.forget(FORGETS, HELD.__getitem__) == [(10, 2), (11, 2)]
    assert sent.forgets == {0: [(9, 1), (10, 1)], 2: [(9, 1)]}
    owner, sent = route(OWNER, True, tmp_path)
    owner.count, owner.made_elsewhere = 3, aliases.__contains__
    assert owner.forget(FORGETS, HELD.__getitem__) == FORGETS
    assert sent.forgets == {1: [(9, 1)], 2: [(9, 1)]}


def test_only_the_worker_that_made_an_alias_frees_it(src):
    """Two workers' node tables on one ledger: an alias worker 1 made (``new_alias``) is known
    to worker 0 once it follows, and worker 0's ``forget`` of it frees nothing (the kernel's
    FORGET of one lookup of many: worker 1 still shows it); worker 1's frees it, for both."""
    fd = memory()
    try:
        trees = []
        for index in (0, 1):
            ledger = Ledger(fd=os.dup(fd))
            ledger.share(index, 2)
            ledger.start()
            trees.append(compose_tree(LocalStorage(str(src)), ledger=ledger))

        async def chunk(tree) -> int:
            arr = await tree.names.lookup(ROOT_INODE, "a")
            return (await tree.names.lookup(arr.ino, "1.1")).ino

        ino = trio.run(chunk, trees[1])
        alias = trees[1].nodes.new_alias(ino)
        trio.run(chunk, trees[0])
        trees[0].numbers.ledger.catch_up()
        assert trees[0].nodes.made_elsewhere(alias) and not trees[1].nodes.made_elsewhere(alias)
        assert trees[0].nodes.forget(alias) is None
        assert trees[0].nodes.node_key(alias) == trees[0].nodes.node_key(ino)
        assert trees[1].nodes.forget(alias) == ino
        trees[0].numbers.ledger.catch_up()
        with pytest.raises(OSError) as e:
            trees[0].nodes.node_key(alias)
        assert e.value.errno == errno.ENOENT
    finally:
        os.close(fd)
