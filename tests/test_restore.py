"""A restarted worker takes over the numbers of the dead one (``Numbers.restore``) without
reading any array first: each array slot is bound at its first use (``Hierarchy.bind``, run by the
kernel adapter when a request raises ``Unbound``), so the worker serves at once however many
arrays the dead one had read (on an object store, one ``zarr.json`` GET each, one after the
other). In process: a counting storage, two trees on one ledger (the dead worker's, the next)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from shardfs.app.compose import compose_tree
from shardfs.storage.local import LocalStorage
from shardfs.tree.ledger import Ledger, memory
from shardfs.tree.nodes import ChunkKey, Unbound
from shardfs.tree.nodetable import ROOT_INODE

N = 12


class Counting(LocalStorage):
    """A local source that counts the ``zarr.json`` reads."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.metadata_reads: list[str] = []

    def read_versioned(self, key, rng):
        if key.endswith("zarr.json"):
            self.metadata_reads.append(key)
        return super().read_versioned(key, rng)


@pytest.fixture
def src(tmp_path) -> Path:
    import zarr

    root = tmp_path / "src"
    g = zarr.open_group(str(root), mode="w")
    for i in range(N):
        a = g.create_array(f"a{i}", shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="<i4", fill_value=0)
        a[...] = i + 1
    return root


def opened(fd: int) -> Ledger:
    led = Ledger(fd=os.dup(fd))
    led.start()
    return led


def test_a_restarted_worker_reads_no_array_before_it_serves_and_each_keeps_its_slot_at_first_use(src):
    fd = memory()
    try:
        dead = compose_tree(Counting(str(src)), ledger=opened(fd))
        order = [f"a{i}" for i in reversed(range(N))]  # slots in reverse: a new numbering would differ

        async def chunk_inodes(tree, names: list[str]) -> dict[str, int]:
            out = {}
            for name in names:
                arr = await tree.names.lookup(ROOT_INODE, name)
                out[name] = (await tree.names.lookup(arr.ino, "1.1")).ino
            return out

        before = trio.run(chunk_inodes, dead, order)
        slot3 = dead.hierarchy.arrays["a3"].slot
        dead.numbers.ledger.note("u", 10**6, "c", slot3, [1, 0])  # a temporary renamed onto a3's chunk 1.0
        records = opened(fd).records()

        storage = Counting(str(src))
        tree = compose_tree(storage, ledger=opened(fd))
        trio.run(tree.numbers.restore, records)
        assert storage.metadata_reads == []  # nothing read before serving
        kept = tree.numbers.records()  # a compaction now keeps every slot and the alias
        assert sorted(r for r in kept if r[0] == "a") == sorted(r for r in records if r[0] == "a")
        assert ["u", 10**6, "c", slot3, [1, 0]] in kept

        with pytest.raises(Unbound) as e:
            tree.nodes.node_key(before["a5"])
        assert e.value.path == "a5"
        with pytest.raises(Unbound):
            tree.names.arrays["a5"]  # (a shard or key directory's inode of it asks so)
        assert trio.run(tree.numbers.bind, "a5")
        assert storage.metadata_reads == ["a5/zarr.json", "zarr.json"]  # (and its group's)
        key = tree.nodes.node_key(before["a5"])
        assert isinstance(key, ChunkKey) and (key.arr.path, key.coords) == ("a5", (1, 1))
        assert not trio.run(tree.numbers.bind, "a5")  # bound: nothing more to read

        with pytest.raises(Unbound):
            tree.nodes.node_key(10**6)
        trio.run(tree.numbers.bind, "a3")
        alias = tree.nodes.node_key(10**6)
        assert isinstance(alias, ChunkKey) and (alias.arr.path, alias.coords) == ("a3", (1, 0))
        assert 10**6 in tree.nodes.aliases(tree.nodes.chunk_ino(alias.arr, (1, 0)))

        (src / "a7").rename(src / "moved7")  # a directory renamed through the mount before a7 was read
        tree.names.moved("a7", "moved7")
        trio.run(tree.numbers.bind, "moved7")
        key = tree.nodes.node_key(before["a7"])
        assert isinstance(key, ChunkKey) and key.arr.path == "moved7"

        rest = [name for name in order if name != "a7"]
        assert trio.run(chunk_inodes, tree, rest) == {name: before[name] for name in rest}  # the same numbers
        reads = [key for key in storage.metadata_reads if key != "zarr.json"]  # (the root group's)
        assert sorted(reads) == sorted(f"{name}/zarr.json" for name in [*rest, "moved7"])  # each array once
    finally:
        os.close(fd)


def test_a_new_worker_keeps_no_alias_the_kernel_forgot(src, tmp_path):
    """Every write of zarr's or tensorstore's commits a temporary onto its chunk: its inode shows
    the chunk (an alias, noted in the ledger) until the kernel forgets it. A new worker read every
    one noted since the last compaction and kept each as a live alias (its RSS grew with the writes:
    the soak's RSS steps at worker kills, +11 MiB per 9000 commits): a forget is noted, and the
    next worker reads and keeps only the aliases still held; numbers still follow the highest."""
    from shardfs.writes.spill import SpillBuffer

    fd = memory()
    try:
        dead = compose_tree(Counting(str(src)), ledger=opened(fd))

        async def arr_ino() -> int:
            return (await dead.names.lookup(ROOT_INODE, "a1")).ino

        parent = trio.run(arr_ino)
        arr = dead.hierarchy.arrays["a1"]
        inos = []
        for i in range(2000):
            st = dead.nodes.new_staging(parent, f"1.1.{i}.partial", SpillBuffer(str(tmp_path)))
            dead.nodes.drop_staging(parent, f"1.1.{i}.partial", ChunkKey(arr, (1, 1)))
            inos.append(st.ino)
            if i != 1000:  # one the kernel still holds
                dead.nodes.forget(st.ino)
        records = opened(fd).records()
        assert len(records) < 10, records[:20]  # (the slot, the array's directory, the held alias, the last forget)
        tree = compose_tree(Counting(str(src)), ledger=opened(fd))
        trio.run(tree.numbers.restore, records)
        trio.run(tree.numbers.bind, "a1")
        held = tree.nodes.node_key(inos[1000])
        assert isinstance(held, ChunkKey) and (held.arr.path, held.coords) == ("a1", (1, 1))
        with pytest.raises(OSError):
            tree.nodes.node_key(inos[5])  # forgotten: unknown (ENOENT)
        assert tree.nodes.aliases(tree.nodes.chunk_ino(held.arr, (1, 1))) == {inos[1000]}
        slot = held.arr.slot  # another worker's alias, then its forget, read live (a shared ledger)
        tree.nodes.follow([["u", 10**7, "c", slot, [1, 0]], ["u", 10**7 + 1, "c", slot, [1, 0]], ["f", 10**7]])
        with pytest.raises(OSError):
            tree.nodes.node_key(10**7)
        assert tree.nodes.aliases(tree.nodes.chunk_ino(held.arr, (1, 0))) == {10**7 + 1}
        fresh = tree.nodes.new_staging(parent, "x.partial", SpillBuffer(str(tmp_path)))
        assert fresh.ino > max(inos)  # numbers follow every one given out
    finally:
        os.close(fd)
