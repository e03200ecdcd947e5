"""Which lookups a worker of ``-o workers=N`` forgets when the kernel's FORGET reaches it
(``shardfs.kernel.route.Route.forget``), in-process: each worker counts the lookups of the
replies it made, so a FORGET reaching one that counted none of an inode's lookups must free
nothing there (found by tests/test_workers_pages.py: a temporary renamed onto a chunk, its
inode freed by the other worker while the kernel still showed it, gave ENOENT at its next open).
"""

from __future__ import annotations

from shardfs.kernel.owner import OWNER, Areas, Marks
from shardfs.kernel.route import Route
from shardfs.tree.nodetable import NodeTable

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
    return Route(index, lambda fh: fh % 2, sent, areas), sent  # type: ignore[arg-type]  # Sent: the links it uses


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
