"""The table of versions the N workers of a mount share (``shardfs.storage.sharedversions``),
in process: two views of one memfd stand for two workers (a view maps the table and locks it
through an open file of its own, as each worker does)."""

from __future__ import annotations

import os
import struct
import time

import pytest

from shardfs.base.memtables import key_hash
from shardfs.storage import UNKNOWN, Unusable, Version
from shardfs.storage import sharedversions as sv


@pytest.fixture
def table():
    fd = sv.memory()
    views = [sv.SharedVersions(fd, 1.0), sv.SharedVersions(fd, 1.0)]
    os.close(fd)
    yield views
    for v in views:
        v.close()


def test_what_one_worker_saw_the_other_finds(table):
    a, b = table
    local, obj = Version(123456789, 64, 17), Version('"9b2cf535f27731c974343645a3985328"', 10, -5)
    a.put("x/c/0/0", local, a.token())
    a.put("y/c/1", obj, a.token())
    a.put("gone", None, a.token())
    assert b.get("x/c/0/0") == local and isinstance(b.get("x/c/0/0").tag, int)
    assert b.get("y/c/1") == obj
    assert b.get("gone") is None
    assert b.get("never") is UNKNOWN
    odd = os.fsdecode(b"z/\xff/zarr.json")  # (a local name that is not UTF-8: a lone surrogate)
    a.put(odd, local, a.token())
    assert b.get(odd) == local and b.get("z/\xff/zarr.json") is UNKNOWN


def test_a_forget_is_every_workers_and_voids_the_answers_being_fetched(table):
    a, b = table
    a.put("k", Version(1, 2, 3), a.token())
    token = b.token()  # b asks the store about "j" ...
    a.forget("k")  # ... while a changes "k"
    assert b.get("k") is UNKNOWN
    b.put("j", Version(4, 5, 6), token)  # (it may predate the change: not kept)
    assert a.get("j") is UNKNOWN and b.get("j") is UNKNOWN
    b.put("j", Version(4, 5, 6), b.token())
    assert a.get("j") == Version(4, 5, 6)


def test_a_clear_forgets_every_key_for_every_worker(table):
    a, b = table
    for i in range(20):
        a.put(f"k{i}", Version(i, i, i), a.token())
    b.clear()
    assert all(a.get(f"k{i}") is UNKNOWN for i in range(20))
    a.put("k3", Version(9, 9, 9), a.token())
    assert b.get("k3") == Version(9, 9, 9)


def test_an_answer_expires_after_its_ttl():
    fd = sv.memory()
    short, reader = sv.SharedVersions(fd, 0.2), sv.SharedVersions(fd, 1.0)
    os.close(fd)
    short.put("k", Version(1, 2, 3), short.token())
    assert reader.get("k") == Version(1, 2, 3)
    time.sleep(0.25)
    assert reader.get("k") is UNKNOWN


def test_an_answer_a_worker_read_is_read_again_only_while_its_entry_the_epoch_and_the_time_hold():
    """A worker remembers where it read an answer (``_seen``): another worker's newer answer, a
    forget, a clear, an eviction by another key and the end of the answer's ttl each make it
    ask the table again, at once."""
    fd = sv.memory()
    a, b, short = sv.SharedVersions(fd, 1.0), sv.SharedVersions(fd, 1.0), sv.SharedVersions(fd, 0.2)
    os.close(fd)
    old, new = Version(1, 2, 3), Version(4, 5, 6)
    a.put("k", old, a.token())
    assert b.get("k") == old
    a.put("k", new, a.token())
    assert b.get("k") == new and b.get("k") == new
    a.forget("k")
    assert b.get("k") is UNKNOWN
    a.put("k", old, a.token())
    assert b.get("k") == old
    a.clear()
    assert b.get("k") is UNKNOWN
    short.put("k", new, short.token())
    assert b.get("k") == new
    time.sleep(0.25)
    assert b.get("k") is UNKNOWN
    b.put("k", old, b.token())
    assert b.get("k") == old
    off = _entry_of(a, "k")
    h = key_hash("k")
    a._write(off, sv.VERSION_INT, h + 1, time.monotonic() + 1, 0, 7, 7, struct.pack("<q", 7))  # evicted
    assert b.get("k") is UNKNOWN


def test_unusable_answers_and_long_tags_are_not_remembered(table):
    a, b = table
    a.put("fifo", Unusable(5, "not a regular file (a FIFO)", "/x/fifo"), a.token())
    a.put("long", Version("e" * (sv.TAG_BYTES + 1), 1, 1), a.token())
    a.put("fits", Version("e" * sv.TAG_BYTES, 1, 1), a.token())
    assert b.get("fifo") is UNKNOWN and b.get("long") is UNKNOWN
    assert b.get("fits") == Version("e" * sv.TAG_BYTES, 1, 1)


def _entry_of(view: sv.SharedVersions, key: str) -> int:
    """The offset of ``key``'s entry (it has one)."""
    h = key_hash(key)
    return next(off for off in (view._place(h, i) for i in range(sv.PROBES))
                if struct.unpack_from("<Q", view._map, off + 8)[0] == h)


def test_an_entry_a_killed_worker_left_half_written_is_a_miss_until_written_again(table):
    a, b = table
    a.put("k", Version(1, 2, 3), a.token())
    off = _entry_of(a, "k")
    seq = struct.unpack_from("<I", a._map, off)[0]
    struct.pack_into("<I", a._map, off, seq | 1)  # a writer died between its two stores of seq
    struct.pack_into("<Q", a._map, off + 32, 999)  # ... having written part of the new answer
    assert b.get("k") is UNKNOWN
    b.put("k", Version(4, 5, 6), b.token())
    assert a.get("k") == Version(4, 5, 6)


def test_keys_that_share_a_home_are_kept_apart_and_an_evicted_one_is_a_miss(table):
    a, b = table
    keys = [f"arr/c/{i}" for i in range(200_000)]
    home = {}
    for k in keys:  # PROBES + 1 keys with one home
        home.setdefault(key_hash(k) & (sv.CAPACITY - 1), []).append(k)
    crowd = next(ks for ks in home.values() if len(ks) > sv.PROBES)[:sv.PROBES + 1]
    for i, k in enumerate(crowd):
        a.put(k, Version(i, i, i), a.token())
    found = [b.get(k) for k in crowd]
    assert found[-1] == Version(sv.PROBES, sv.PROBES, sv.PROBES)  # (it took its home's place)
    assert found[0] is UNKNOWN  # (the key it evicted)
    assert found[1:-1] == [Version(i, i, i) for i in range(1, sv.PROBES)]
