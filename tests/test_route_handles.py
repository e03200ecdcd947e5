"""Which worker of ``-o workers=N`` serves a request on a handle another worker opened
(``shardfs.kernel.route.Route.link``), in-process: a read-only mount's RELEASE is served where
it arrives without a look at the handle (``here``: a catch-up of the shared ledger), and so is a
writable mount's of a handle a worker other than the owner opened (a read handle), or the owner
before it marked anything; a READ, and the RELEASE of a writable mount owner's handle once it
marked an area (maybe a write handle), first ask whether this worker may serve it."""

from __future__ import annotations

import pytest

from shardfs.kernel.owner import OWNER, Areas, Marks
from shardfs.kernel.route import Route
from shardfs.tree.nodetable import NodeTable

OTHERS = 8  # a handle number worker 1 gave out (``Ledger.owner`` of 3 workers: (fh - 1) % 3)
OWN = 9  # one this worker (2) gave out
OWNERS = 7  # one the owner (slot 0) gave out
INO = 1 << 40


class Links:
    """The links of ``Route`` (``Peers.link``): the slots a request was sent to."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def link(self, slot: int) -> int:
        self.sent.append(slot)
        return slot


def route(writable: bool, tmp_path, here: int | None) -> tuple[Route, Links, list[int]]:
    """Worker 2 of 3 (not the owner); ``here``: what ``Reopen.here`` answers of any handle
    (asked: the list)."""
    asked: list[int] = []

    def ask(fh: int) -> int | None:
        asked.append(fh)
        return here

    links = Links()
    areas = Areas(NodeTable([]), Marks(str(tmp_path / "marks"))) if writable else None
    return Route(2, lambda fh: (fh - 1) % 3, links, areas, ask, None,  # type: ignore[arg-type]  # Links: what it uses
                 lambda ino: None), links, asked


def test_a_release_of_another_workers_handle_on_a_read_only_mount_is_served_here_unasked(tmp_path):
    r, links, asked = route(False, tmp_path, None)
    assert r.link("release", (OTHERS,)) is None
    assert asked == [] and links.sent == []


@pytest.mark.parametrize("here", [INO, None], ids=["may_be_served_here", "elsewhere"])
def test_a_read_of_another_workers_handle_asks_first(tmp_path, here):
    r, links, asked = route(False, tmp_path, here)
    assert r.link("read", (OTHERS, 0, 4096)) == (None if here else 1)
    assert asked == [OTHERS] and links.sent == ([] if here else [1])


def test_a_release_of_a_handle_a_writable_mounts_other_worker_opened_is_served_here_unasked(tmp_path):
    """(A file opened for writing is the owner's: the other workers' handles are read handles.)"""
    r, links, asked = route(True, tmp_path, None)
    assert r.link("release", (OTHERS,)) is None
    assert asked == [] and links.sent == []


def test_a_release_of_the_owners_handle_on_a_writable_mount_asks_first_once_it_marked_an_area(tmp_path):
    """(The owner's handle may then be a write handle: only the owner commits it. ``here``
    answers None for a write handle.) Before the owner marked anything, every handle it holds
    is a read handle of what the source shows: served here unasked."""
    r, links, asked = route(True, tmp_path, None)
    owners = Marks(r.areas.marks.path)
    owners.start()
    r.areas.marks.start()
    assert r.link("release", (OWNERS,)) is None
    assert asked == [] and links.sent == []
    owners.note("arr")  # (an open for writing in array arr, before it is answered)
    assert r.link("release", (OWNERS,)) == OWNER
    assert asked == [OWNERS] and links.sent == [OWNER]
    owners.close()


def test_a_request_on_this_workers_own_handle_is_served_here_unasked(tmp_path):
    r, links, asked = route(True, tmp_path, None)
    assert r.link("read", (OWN, 0, 4096)) is None
    assert r.link("release", (OWN,)) is None
    assert asked == [] and links.sent == []
