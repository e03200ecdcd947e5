"""The numbers the tree gave the kernel, as the ledger notes them (``shardfs.tree.ledger``): the
arrays' slots (``Hierarchy``), the inodes of node keys and staging files (``NodeTable``) and the
structure made through the mount (``Made``).

``Numbers`` is what the kernel adapter asks of them as a whole: the records still in effect
and the compaction of a full ledger (``compact_if_full``, at each release), the take-over of a
dead worker's numbers (``restore``), and, with ``-o workers=N``, what the other workers gave
out meanwhile (``follow``).
"""

from __future__ import annotations

from typing import Any, Callable

from shardfs.tree.hierarchy import Hierarchy
from shardfs.tree.ledger import Ledger
from shardfs.tree.made import Made
from shardfs.tree.nodetable import NodeTable


class Numbers:
    """The numbers of one mount's tree, noted in ``ledger``."""

    def __init__(self, ledger: Ledger, hierarchy: Hierarchy, nodes: NodeTable, made: Made) -> None:
        self.ledger = ledger
        self.hierarchy = hierarchy
        self.nodes = nodes
        self.made = made

    @property
    def shared(self) -> bool:
        """True when other workers serve the same connection (``-o workers=N``)."""
        return self.ledger.shared

    def records(self) -> list[list[Any]]:
        """The tree's records still in effect (``Ledger.rewrite``)."""
        return [*self.hierarchy.records(), *self.nodes.records(), *self.made.records()]

    def compact_if_full(self, held: Callable[[], list[list[Any]]]) -> None:
        """Compact the ledger if it is full: a shared one in place (every worker's records in
        effect: ``Ledger.compact``), else rewritten with the tree's records in effect and
        ``held()``'s (the open handles': the adapter's)."""
        ledger = self.ledger
        if ledger.full:
            if ledger.shared:
                ledger.compact()
            else:
                ledger.rewrite([*self.records(), *held()])

    async def follow(self) -> bool:
        """Learn what the other workers appended to the shared ledger, and read the arrays of
        the slots they gave out; True if that taught a number (a slot, an inode)."""
        records = self.ledger.catch_up()
        bound = await self.hierarchy.load_followed()
        return bound or any(rec[0] in ("a", "k") for rec in records)

    async def restore(self, records: list[list[Any]]) -> None:
        """Take over the numbers a dead worker gave the kernel (its ledger's ``records``); a
        worker of a shared ledger takes what every worker gave out so far (its ``tail``). No
        array is read here: each slot is bound at its first use (``bind``)."""
        if self.shared:
            self.hierarchy.follow(records)
        else:
            await self.hierarchy.restore(records)
        self.nodes.restore(records)
        self.made.restore(records)

    async def bind(self, path: str) -> bool:
        """Read the array at ``path`` whose slot was given out but is not bound here
        (``Unbound``: each is read at its first use); True if there was one."""
        return await self.hierarchy.bind(path)
