"""scripts/bench's passes: a pass after another process dropped the kernel's
caches since the bench last did (the tests and benches of other checkouts on a shared machine write
``/proc/sys/vm/drop_caches``) is left out of the medians (``bench_lib.harness.Tally``).

Such a pass finds its mount's names and pages evicted (measured: a warm zarr 2.18 read made a
LOOKUP a chunk file, or read 1,253 chunks again), and one side's spoiled pass against the
other's clean one made the `--baseline` rows say supervision cost 2-3x (doc/BENCHMARKING.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from bench_lib import harness  # noqa: E402
from bench_lib.harness import Bench, Tally, cache_drops  # noqa: E402


def dropping(*spoiled: bool):
    """An ``others_dropped`` answering ``spoiled`` in turn."""
    answers = iter(spoiled)
    return lambda: next(answers)


def test_a_pass_spoiled_by_a_cache_drop_is_left_out_of_the_medians():
    tally = Tally(dropping(False, False, False, True, False, False))
    tally.put("shardfs", cat1=1.7, cpu=300.0)
    tally.put("shardfs", cat2=0.6)
    tally.put("base", cat1=1.8, cpu=310.0)
    assert tally.put("base", cat2=2.4)  # another process dropped the caches meanwhile
    tally.put("base", cat1=1.3, cpu=290.0)
    tally.put("base", cat2=0.7)
    values, said = tally.values()
    assert values["cat2"] == {"shardfs": [0.6], "base": [0.7]}
    assert values["cat1"] == {"shardfs": [1.7], "base": [1.8, 1.3]}
    assert values["cpu"] == {"shardfs": [300.0], "base": [310.0, 290.0]}
    assert said is not None and "1 passes left out" in said and "cat2 base" in said and "kept" not in said
    assert "cat2 2.4 (spoiled)" in tally.shown


def test_a_figure_spoiled_in_every_pass_keeps_those_and_says_so():
    tally = Tally(dropping(True, False))
    tally.put("shardfs", zarr2=2.7, cpu=500.0)
    tally.put("base", zarr2=1.5, cpu=250.0)
    values, said = tally.values()
    assert values["zarr2"] == {"shardfs": [2.7], "base": [1.5]}
    assert values["cpu"] == {"shardfs": [500.0], "base": [250.0]}
    assert said is not None and "kept for want of a clean one: zarr2 shardfs, cpu shardfs" in said
    assert tally.fallback == {("zarr2", "shardfs"), ("cpu", "shardfs")}  # (their rows say so)


def test_nothing_spoiled_nothing_said():
    tally = Tally(dropping(False, False))
    tally.put("shardfs", ls=0.1)
    tally.put("shardfs", ls=None)
    assert tally.values() == ({"ls": {"shardfs": [0.1]}}, None)


def test_a_drop_by_another_process_spoils_every_pass_until_the_bench_drops_the_caches(
        monkeypatch: pytest.MonkeyPatch):
    """``Bench.others_dropped``: /proc/vmstat's drop counters moved since the bench dropped the
    caches itself (a drop during a 1st pass evicts what the 2nd would find: measured, a zarr
    read after one made a LOOKUP a chunk file, and another read 1,253 chunks again)."""
    counted = [cache_drops()]
    assert counted[0] >= 0
    monkeypatch.setattr(harness, "cache_drops", lambda: counted[0])
    monkeypatch.setattr(harness.os, "sync", lambda: None)
    written = []

    class Sink:
        """/proc/sys/vm/drop_caches, not written (on a shared machine: see above)."""

        def __init__(self, path: str, mode: str) -> None:
            assert (path, mode) == ("/proc/sys/vm/drop_caches", "w")

        def __enter__(self) -> "Sink":
            return self

        def __exit__(self, *exc: object) -> None:
            counted[0] += 2  # ``echo 3``: drop_pagecache and drop_slab

        def write(self, text: str) -> None:
            written.append(text)

    monkeypatch.setattr(harness, "open", Sink, raising=False)  # (``drop_caches``'s only ``open``)
    bench = Bench.__new__(Bench)  # (no work directory: only the drop bookkeeping)
    bench.drop_ok, bench.problems = True, []
    bench.drop_caches()
    assert written == ["3\n"]
    assert not bench.others_dropped()  # its own drop is not another's
    counted[0] += 1  # another process: ``echo 2 > /proc/sys/vm/drop_caches``
    assert bench.others_dropped()
    assert bench.others_dropped()  # the next pass found the mount's names evicted too
    bench.drop_caches()
    assert not bench.others_dropped()
