"""Lookup counts of the inodes the kernel holds (``shardfs.kernel.inodes.LookupCounts``), in-process
against a dict as the model (hypothesis): counts of neighbouring inodes share an int, counts of
15 and more live apart; every ``add``/``drop`` sequence must answer as the dict does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import budget
from shardfs.kernel.inodes import LookupCounts
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
