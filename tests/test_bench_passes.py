"""scripts/bench's second passes: a pass during which another process dropped the kernel's
caches (the tests and benches of other checkouts on a shared machine write
``/proc/sys/vm/drop_caches``) is left out of the medians (``bench_lib.harness.Tally``).

Such a pass finds its mount's names and pages evicted: a 2nd ``cat`` pass of the supervised
mount took 2.0-2.8 s against 0.6-1.0 s, a warm zarr 2.18 read made a LOOKUP a chunk file,
and the `--baseline` rows said supervision cost 2-3x (doc/BENCHMARKING.md)."""

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


def test_nothing_spoiled_nothing_said():
    tally = Tally(dropping(False, False))
    tally.put("shardfs", ls=0.1)
    tally.put("shardfs", ls=None)
    assert tally.values() == ({"ls": {"shardfs": [0.1]}}, None)


def test_the_bench_sees_a_drop_by_another_process_once(monkeypatch: pytest.MonkeyPatch):
    """``Bench.others_dropped``: /proc/vmstat's drop counters moved since the bench looked (or
    dropped the caches itself: ``drop_caches`` takes its own drop as seen)."""
    counted = [cache_drops()]
    assert counted[0] >= 0
    monkeypatch.setattr(harness, "cache_drops", lambda: counted[0])
    bench = Bench.__new__(Bench)  # (no work directory: only the drop bookkeeping)
    bench.drops_seen = counted[0]
    assert not bench.others_dropped()
    counted[0] += 2  # ``echo 3 > /proc/sys/vm/drop_caches``: drop_pagecache and drop_slab
    assert bench.others_dropped()
    assert not bench.others_dropped()
